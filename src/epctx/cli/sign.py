"""``epctx sign PATH --key KEY [--certificate CERT [--chain PEM]...] [--signature SIG]``: sign a context model's
folder (or any folder) in OpenSSF model signing's format; ``model.sig`` beside the model by default."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("sign", help="sign a context model's folder (OpenSSF model signing format)")
    p.add_argument("path", type=Path, help="a context model (its folder is signed) or a folder")
    p.add_argument("--key", type=Path, required=True, help="EC private key, PEM (P-256, P-384 or P-521)")
    p.add_argument("--certificate", type=Path, help="the key's signing certificate, PEM (certificate mode)")
    p.add_argument(
        "--chain", type=Path, action="append", default=[], help="certificate chain PEM (repeatable)"
    )
    p.add_argument(
        "--signature", type=Path, help="where the signature goes (default: model.sig in the folder)"
    )
    p.set_defaults(func=sign)


def sign(args: argparse.Namespace) -> int:
    from epctx.trust.sign import sign_folder

    sig = sign_folder(
        args.path, args.key, signature=args.signature, certificate=args.certificate, chain=args.chain
    )
    print(f"signed {args.path} -> {sig}")
    return 0
