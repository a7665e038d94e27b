"""The trust check's cold path (``policy.py`` imports it only when something is verified or refused): the
signature read and verified, the required files hashed and compared with it, the record saved, and refusals
(or warnings) naming the file, the policy and what was expected. A warm session, whose record stands, never
imports it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from epctx import options as opt
from epctx.errors import Untrusted

if TYPE_CHECKING:
    from typing import Protocol

    from epctx.trust.bundle import SignedManifest
    from epctx.trust.digests import Hasher
    from epctx.trust.keyless import Expected
    from epctx.trust.record import Record

    class Setting(Protocol):  # policy.py's _Setting, as used here
        policy: str
        keys: tuple[Path, ...]
        root: Path
        signature: Path
        watched: tuple[str, ...]
        keyless: Expected | None


__all__ = ["checked", "refuse_or_warn", "verify_files"]

logger = logging.getLogger("epctx")


def checked(
    todo: Mapping[Path, bool],
    setting: Setting,
    record: Record,
    stamps: dict[str, list[int] | None],
    manifest: SignedManifest | None,
    hasher: Hasher | None = None,
    notes: dict[str, object] | None = None,
) -> bool:
    """Verify ``todo`` (against ``manifest`` when given, else the signature read and verified now); on success
    save ``stamps`` (taken before hashing) in ``record`` with ``notes`` (the unchanged files') and what the
    hasher noted for the files hashed now, and return True; otherwise refuse or warn."""
    from epctx.trust.digests import notes_of

    reasons, signer, verified = verify_files(todo, setting, manifest, hasher)
    if not reasons:
        until = verified.valid_until if verified is not None else None
        notes = dict(notes or {})
        for path in todo:
            noted = notes_of(stamps[str(path)])
            if noted is not None:
                notes[str(path)] = noted
            else:
                notes.pop(str(path), None)
        record.save(stamps, [k for k in stamps if k not in setting.watched], signer, until, notes)
        logger.info("epctx.trust: %s verified, signed by %s", ", ".join(map(str, todo)), signer)
        return True
    natives = {str(path): native for path, native in todo.items() if str(path) in reasons}
    refuse_or_warn(setting.policy, natives, reasons, str(setting.signature), "")
    return False


def verify_files(
    required: Mapping[Path, bool],
    setting: Setting,
    manifest: SignedManifest | None = None,
    hasher: Hasher | None = None,
) -> tuple[dict[str, str], str, SignedManifest | None]:
    """Why each required file is not covered (empty: all are), who signed, and the manifest verified."""
    from epctx.trust.bundle import load_trusted_keys, read_and_verify
    from epctx.trust.digests import file_sha256, relative_name

    if manifest is None:
        try:
            manifest = read_and_verify(setting.signature, load_trusted_keys(setting.keys), setting.keyless)
        except Untrusted as exc:
            reason = str(exc.args[0]) if exc.args else str(exc)
            return {str(path): reason for path in required}, "", None
    reasons: dict[str, str] = {}
    for path in required:
        name = relative_name(path, setting.root)
        expected = manifest.digests.get(name) if name is not None else None
        if expected is None:
            reasons[str(path)] = f"the signature (by {manifest.signer}) does not cover it"
        elif file_sha256(path, hasher) != expected:
            reasons[str(path)] = (
                f"its SHA-256 differs from the one signed by {manifest.signer} (changed since it was signed)"
            )
    return reasons, manifest.signer, manifest


def refuse_or_warn(
    policy: str, natives: Mapping[str, bool], reasons: Mapping[str, str], signature: str, general: str
) -> None:
    where = f"the signature {signature!r}" if signature else "a signature"
    for name, native in natives.items():
        reason = reasons.get(name, general)
        refused = policy == "require" or (policy == "require-native" and native)
        kind = "carries native code" if native else "data only"
        message = (
            f"{opt.TRUST_POLICY}={policy}: {name!r} ({kind}) is not covered by a valid signature from a trusted "
            f"key: expected it in {where} with the same SHA-256; {reason}"
        )
        if refused:
            raise Untrusted(message)
        logger.warning("%s (loaded anyway)", message)
