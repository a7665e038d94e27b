"""The load policy (``epctx.trust.policy``), applied to a context model's files before any EP sees a byte.

- ``off`` (default): nothing is checked, nothing of ``epctx.trust`` is imported.
- ``warn``: every file is checked; an unsigned or mismatching one is logged, and loads.
- ``require``: the context model, every context binary and every external data file it references must be
  in a signature (``epctx.trust.signature``, default ``model.sig`` beside the model) made by a trusted key
  (``epctx.trust.keys``) with the same SHA-256; anything else is ``Untrusted`` naming the file, the policy
  and what was expected.
- ``require-native``: as ``require`` for the payloads that carry native code (``carries_native_code``: IREE modules,
  OpenVINO blobs, any EP epctx does not know; embedded ones make the model file count as native); data-only
  payloads load unsigned (logged).

Signature verification (``bundle.py``) and hashing run once; the record (``record.py``) lets the next
session skip both while no file involved has been written."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from epctx import options as opt
from epctx.errors import InvalidArgument, Untrusted

__all__ = ["POLICIES", "carries_native_code", "check_context_files"]

logger = logging.getLogger("epctx")
POLICIES = opt.TRUST_POLICIES
SIGNATURE_NAME = "model.sig"

# Payloads known to carry no native code (decided from the EPContext node's ``source``, no byte read): the
# Example EP's programs are interpreted. IREE's llvm-cpu modules hold machine code the runtime maps and runs;
# OpenVINO blobs may hold device kernels (GPU / NPU); an EP epctx does not know is native too:
# ``require-native`` never guesses in an attacker's favour.
_DATA_ONLY = frozenset({"ExampleExecutionProvider", "CPUExecutionProvider"})


def carries_native_code(source: str | None) -> bool:
    return (source or "") not in _DATA_ONLY


def check_context_files(
    model_path: Path | None,
    files: Mapping[Path, bool],
    model_native: bool,
    config: opt.SessionConfig,
    *,
    from_callback: Mapping[str, bool] | None = None,
) -> dict[str, list[int] | None]:
    """``files``: each file the context model references -> whether it carries native code. Returns the
    stamps (device, inode, size, ctime) the files had when verified: the loader compares them once it has
    opened a binary, so a file replaced between this check and the load is refused too."""
    policy = config.trust_policy  # one of POLICIES (SessionConfig checked it)
    if policy == "off":
        return {}
    if from_callback:  # binaries from the EPContext data read callback: authenticated there, or not at all
        _refuse_or_warn(policy, from_callback, {}, "",
                        "it comes from the EPContext data read callback, which no folder signature covers "
                        "(authenticate it in the callback, e.g. with AES-GCM)")  # fmt: skip
    if model_path is None:
        _refuse_or_warn(policy, {"<model bytes>": model_native or any(files.values())}, {}, "",
                        "a model given as bytes has no folder a signature could cover")  # fmt: skip
        return {}
    required: dict[Path, bool] = {**files, model_path: model_native}  # binaries first: refusals name them
    keys = [Path(p) for p in config.trust_keys]
    given = config.trust_signature
    root = Path(config.trust_root) if config.trust_root else model_path.absolute().parent  # a package's root
    signature = Path(given) if given else root / SIGNATURE_NAME
    if not keys:
        raise InvalidArgument(
            f"{opt.TRUST_POLICY}={policy} needs trusted keys: set {opt.TRUST_KEYS} to PEM public keys or "
            f"certificates separated by {os.pathsep!r}"
        )
    from epctx.trust.record import Record

    record = Record(model_path, signature, keys, policy, root=root)
    stamps = record.stamps(required)
    if record.covers(stamps):
        return stamps  # verified before, and nothing involved was written since
    reasons, signer = _verify(required, root, signature, keys)
    if not reasons:
        record.save(stamps, [str(p) for p in required], signer)
        logger.info("epctx.trust: %s verified, signed by %s", model_path, signer)
        return stamps
    natives = {str(path): native for path, native in required.items() if str(path) in reasons}
    _refuse_or_warn(policy, natives, reasons, str(signature), "")
    return {}  # warn / require-native: what loaded unsigned is not compared later


def _verify(
    required: Mapping[Path, bool], folder: Path, signature: Path, keys: list[Path]
) -> tuple[dict[str, str], str]:
    """Why each required file is not covered (empty: all are), and who signed."""
    from epctx.trust.bundle import load_trusted_keys, read_and_verify
    from epctx.trust.digests import file_sha256, relative_name

    try:
        manifest = read_and_verify(signature, load_trusted_keys(keys))
    except Untrusted as exc:
        reason = str(exc.args[0]) if exc.args else str(exc)
        return {str(path): reason for path in required}, ""
    reasons: dict[str, str] = {}
    for path in required:
        name = relative_name(path, folder)
        expected = manifest.digests.get(name) if name is not None else None
        if expected is None:
            reasons[str(path)] = f"the signature (by {manifest.signer}) does not cover it"
        elif file_sha256(path) != expected:
            reasons[str(path)] = (
                f"its SHA-256 differs from the one signed by {manifest.signer} (changed since it was signed)"
            )
    return reasons, manifest.signer


def _refuse_or_warn(
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
