"""Signing a model folder in OpenSSF model signing's format, and verifying one whole (``epctx sign / verify``).

Signing goes through the ``model_signing`` package itself (``pip install epctx[trust]``), so what epctx writes
is model_signing's format by construction: its "files" serialization (one SHA-256 per file of the folder, the
signature and git files ignored), a DSSE envelope signed with an EC key (or a key and its certificate chain),
in a sigstore bundle. Verification (``verify_folder``) is epctx's own (``bundle.py``): the folder must hold
exactly the signed files with the signed digests, as model_signing's verifier requires."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from epctx import options as opt
from epctx.errors import Fail, InvalidArgument, NoSuchFile

if TYPE_CHECKING:
    from epctx.trust.keyless import Expected

__all__ = [
    "FolderVerdict",
    "check_sign_key",
    "model_folder",
    "sign_folder",
    "sign_generated",
    "verify_folder",
]

logger = logging.getLogger("epctx")
SIGNATURE_NAME = "model.sig"
_GIT = (".git", ".gitattributes", ".github", ".gitignore")


def model_folder(path: Path) -> Path:
    """The folder a signature covers: ``path`` itself, or the folder of the model file ``path``."""
    if not path.exists():
        raise NoSuchFile(f"{str(path)!r} does not exist")
    return path if path.is_dir() else path.absolute().parent


def sign_folder(
    path: Path,
    key: Path,
    *,
    signature: Path | None = None,
    certificate: Path | None = None,
    chain: Sequence[Path] = (),
) -> Path:
    """Sign the folder of ``path`` with the EC private key ``key`` (PEM); with ``certificate``, the bundle
    carries it and ``chain`` instead of a key hint. Returns the signature's path."""
    folder = model_folder(path)
    sig = signature if signature is not None else folder / SIGNATURE_NAME
    try:
        import model_signing
    except ImportError as exc:
        raise InvalidArgument("signing needs the model_signing package: pip install 'epctx[trust]'") from exc
    ignored = []
    with contextlib.suppress(ValueError):  # a signature outside the folder is not part of it anyway
        ignored.append(Path(os.path.realpath(sig)).relative_to(os.path.realpath(folder)))
    config = model_signing.signing.Config()
    if certificate is not None:
        config.use_certificate_signer(
            private_key=key, signing_certificate=certificate, certificate_chain=chain
        )
    else:
        config.use_elliptic_key_signer(private_key=key)
    hashing = model_signing.hashing.Config().set_ignored_paths(paths=ignored, ignore_git_paths=True)
    try:
        config.set_hashing_config(hashing).sign(folder, sig)
    except (OSError, ValueError, TypeError) as exc:
        raise Fail(f"signing {str(folder)!r} with {str(key)!r} failed: {exc}") from exc
    return sig


def check_sign_key(config: opt.SessionConfig) -> Path | None:
    """Before compiling: ``epctx.trust.sign_key``'s key exists and model_signing can be imported."""
    given = config.trust_sign_key
    if not given:
        return None
    key = Path(given)
    if not key.is_file():
        raise NoSuchFile(f"{opt.TRUST_SIGN_KEY}: the signing key {given!r} does not exist")
    if importlib.util.find_spec("model_signing") is None:
        raise InvalidArgument(
            f"{opt.TRUST_SIGN_KEY} needs the model_signing package: pip install 'epctx[trust]'"
        )
    return key


def sign_generated(config: opt.SessionConfig, ctx_path: Path) -> None:
    """After generation wrote ``ctx_path``: sign its folder when ``epctx.trust.sign_key`` names a key."""
    key = check_sign_key(config)
    if key is not None:
        sig = sign_folder(
            ctx_path,
            key,
            signature=Path(config.trust_signature) if config.trust_signature else None,
        )
        logger.info("signed %s with %s -> %s", ctx_path.parent, key, sig)


@dataclasses.dataclass(frozen=True)
class FolderVerdict:
    signer: str
    model_name: str
    files: tuple[tuple[str, str], ...]  # (name, "ok" | "changed" | "missing" | "unsigned")

    @property
    def ok(self) -> bool:
        return all(status == "ok" for _, status in self.files)


def verify_folder(
    path: Path, keys: Sequence[Path], *, signature: Path | None = None, keyless: Expected | None = None
) -> FolderVerdict:
    """Verify the signature of ``path``'s folder with ``keys`` (or, a sigstore keyless signature, against
    ``keyless``): raises Untrusted when the signature itself fails; the verdict lists every file (a changed,
    missing or unsigned file makes it not ``ok``)."""
    from epctx.trust.bundle import load_trusted_keys, read_and_verify
    from epctx.trust.digests import file_sha256

    folder = model_folder(path)
    sig = signature if signature is not None else folder / SIGNATURE_NAME
    manifest = read_and_verify(sig, load_trusted_keys(keys), keyless)
    skip = {*manifest.ignore_paths, *_GIT}
    present: dict[str, Path] = {}
    for file in sorted(folder.rglob("*")):
        name = file.relative_to(folder).as_posix()
        if file == sig or any(name == s or name.startswith(f"{s}/") for s in skip) or not file.is_file():
            continue
        present[name] = file
    rows = []
    for name in sorted({*present, *manifest.digests}):
        if name not in present:
            rows.append((name, "missing"))
        elif name not in manifest.digests:
            rows.append((name, "unsigned"))
        else:
            same = file_sha256(present[name]) == manifest.digests[name]
            rows.append((name, "ok" if same else "changed"))
    return FolderVerdict(manifest.signer, manifest.model_name, tuple(rows))
