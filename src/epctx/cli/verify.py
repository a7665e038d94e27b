"""``epctx verify PATH --key PEM [--key PEM]... [--signature SIG] [--json]``: check a model folder's signature;
prints who signed what, exits 1 on any failure (a bad signature, an untrusted key, a changed, missing or
unsigned file). A sigstore keyless signature: ``--sigstore-root trusted_root.json --identity ID --issuer URL``
instead of (or besides) ``--key``, verified offline."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("verify", help="verify a context model's folder against its signature")
    p.add_argument("path", type=Path, help="a context model (its folder is checked) or a folder")
    p.add_argument(
        "--key", type=Path, action="append", default=[], help="trusted public key or certificate, PEM"
    )
    p.add_argument("--sigstore-root", help="sigstore keyless: the trusted root (trusted_root.json), offline")
    p.add_argument("--identity", help="sigstore keyless: the signer's identity to expect (e-mail or URI)")
    p.add_argument("--issuer", help="sigstore keyless: the OpenID Connect issuer to expect")
    p.add_argument("--signature", type=Path, help="the signature (default: model.sig in the folder)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=verify)


def verify(args: argparse.Namespace) -> int:
    from epctx.errors import InvalidArgument
    from epctx.trust.keyless import Expected
    from epctx.trust.sign import verify_folder

    sigstore = (args.sigstore_root, args.identity, args.issuer)
    if any(sigstore) and not all(sigstore):
        raise InvalidArgument(
            "a sigstore keyless signature needs --sigstore-root, --identity and --issuer together"
        )
    if not args.key and not any(sigstore):
        raise InvalidArgument("give the trusted keys (--key) or, for sigstore keyless signatures, --sigstore-root, "
                              "--identity and --issuer")  # fmt: skip
    keyless = Expected(*sigstore) if all(sigstore) else None
    verdict = verify_folder(args.path, args.key, signature=args.signature, keyless=keyless)
    if args.json:
        rows = [{"file": name, "status": status} for name, status in verdict.files]
        print(
            json.dumps(
                {"signer": verdict.signer, "model": verdict.model_name, "ok": verdict.ok, "files": rows}
            )
        )
    else:
        print(f"signed by {verdict.signer} (model {verdict.model_name!r})")
        for name, status in verdict.files:
            print(f"  {status:<9}{name}")
        bad = sum(status != "ok" for _, status in verdict.files)
        print(f"{len(verdict.files) - bad} file(s) verified" + (f", {bad} failed" if bad else ""))
    return 0 if verdict.ok else 1
