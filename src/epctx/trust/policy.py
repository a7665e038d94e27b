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

import functools
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from epctx import options as opt
from epctx.errors import InvalidArgument
from epctx.trust.record import Record, matches

if TYPE_CHECKING:
    from epctx.trust.bundle import SignedManifest
    from epctx.trust.digests import Hasher
    from epctx.trust.keyless import Expected

__all__ = ["POLICIES", "carries_native_code", "check_context_files", "check_package_files"]

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


class _Handed:
    """What a package session's check verified, handed to the same session's loader (``check_package_files``):
    the package's record (the loader saves into it), the stamps known verified (the record's, which cover the
    variant's binaries once a session verified them, or this check's) and, when this check verified the
    signature itself, its manifest (the loader hashes the binaries against it without reading it again)."""

    __slots__ = (
        "known",
        "manifest",
        "record",
    )  # a plain class: a dataclass costs ~0.3 ms to define at import

    def __init__(
        self, record: Record, known: dict[str, list[int] | None], manifest: SignedManifest | None
    ) -> None:
        self.record, self.known, self.manifest = record, known, manifest


# A package check's result for the loader of its session, by what the loader's check is about (model, signature,
# keys, policy, root); taken once. An entry a session left (a variant that is a plain model: no loader check) is
# harmless: its stamps are of verified files, compared with the files' stamps at the time of use.
_HANDED: dict[str, _Handed] = {}


class _Setting:
    """Where the signature is and what it is checked against (``epctx.trust.*``), for one session: paths made
    absolute once per distinct setting (a warm session's check is a few ``stat`` calls and one small read)."""

    __slots__ = ("about", "keyless", "keys", "policy", "root", "signature", "watched")

    def __init__(
        self,
        policy: str,
        keys: tuple[Path, ...],
        root: Path,
        signature: Path,
        watched: tuple[
            str, ...
        ],  # the signature, the keys and the sigstore root: stamped with the covered files
        about: str,  # what a record is about besides the model
        keyless: Expected
        | None,  # sigstore keyless signatures: the trusted root, identity and issuer to expect
    ) -> None:
        self.policy, self.keys, self.root, self.signature = policy, keys, root, signature
        self.watched, self.about, self.keyless = watched, about, keyless

    @staticmethod
    def of(model_path: Path, config: opt.SessionConfig) -> _Setting:
        sigstore = (config.trust_sigstore_root, config.trust_sigstore_identity, config.trust_sigstore_issuer)
        _check_keys(config.trust_policy, config.trust_keys, sigstore)
        # the signature's folder: a package's root, or the model's
        root = config.trust_root or os.path.dirname(os.path.abspath(model_path))
        keys, signature = tuple(config.trust_keys), config.trust_signature
        return _setting(config.trust_policy, keys, signature, root, os.getcwd(), sigstore)

    def record(self, model_path: Path) -> Record:
        return Record(model_path, self.watched, self.about, self.policy)

    def handing(self, model_path: Path) -> str:
        return f"{os.path.abspath(model_path)}\n{self.about}"


_SIGSTORE_KEYS = (opt.TRUST_SIGSTORE_ROOT, opt.TRUST_SIGSTORE_IDENTITY, opt.TRUST_SIGSTORE_ISSUER)


def _check_keys(policy: str, keys: tuple[str, ...], sigstore: tuple[str, str, str]) -> None:
    """Trusted keys, or sigstore's trusted root with the identity and issuer to expect (all three, or none)."""
    missing = [key for key, value in zip(_SIGSTORE_KEYS, sigstore) if not value]
    if 0 < len(missing) < len(_SIGSTORE_KEYS):
        raise InvalidArgument(
            f"sigstore keyless verification needs {', '.join(_SIGSTORE_KEYS)} together: {', '.join(missing)} "
            "not set"
        )
    if not keys and missing:
        raise InvalidArgument(
            f"{opt.TRUST_POLICY}={policy} needs trusted keys: set {opt.TRUST_KEYS} to PEM public keys or "
            f"certificates separated by {os.pathsep!r} (or, for sigstore keyless signatures, "
            f"{', '.join(_SIGSTORE_KEYS)})"
        )


@functools.lru_cache(maxsize=64)
def _setting(
    policy: str, keys: tuple[str, ...], signature: str, root: str, cwd: str, sigstore: tuple[str, str, str]
) -> _Setting:
    root = os.path.normpath(os.path.join(cwd, root))
    sig = os.path.normpath(os.path.join(cwd, signature)) if signature else os.path.join(root, SIGNATURE_NAME)
    keyless: Expected | None = None
    extra: tuple[str, ...] = ()
    if sigstore[0]:  # imported only then: a session without keyless settings imports no more than it needs
        from epctx.trust.keyless import Expected

        keyless = Expected(os.path.normpath(os.path.join(cwd, sigstore[0])), *sigstore[1:])
        extra = (keyless.root, keyless.identity, keyless.issuer)
    about = json.dumps([sig, sorted(keys), policy, root, *extra])
    watched = (sig, *keys, *extra[:1])
    return _Setting(policy, tuple(map(Path, keys)), Path(root), Path(sig), watched, about, keyless)


def check_context_files(
    model_path: Path | None,
    files: Mapping[Path, bool],
    model_native: bool,
    config: opt.SessionConfig,
    *,
    from_callback: Mapping[str, bool] | None = None,
    hasher: Hasher | None = None,
) -> dict[str, list[int] | None]:
    """``files``: each file the context model references -> whether it carries native code. Returns the
    stamps (device, inode, size, ctime) the files had when verified: the loader compares them once it has
    opened a binary, so a file replaced between this check and the load is refused too. ``hasher``: hashes a
    file in a pass that also serves the container's checks (``digests.Hasher``; the loader's)."""
    policy = config.trust_policy  # one of POLICIES (SessionConfig checked it)
    if policy == "off":
        return {}
    if from_callback:  # binaries from the EPContext data read callback: authenticated there, or not at all
        from epctx.trust.verify import refuse_or_warn

        refuse_or_warn(policy, from_callback, {}, "",
                        "it comes from the EPContext data read callback, which no folder signature covers "
                        "(authenticate it in the callback, e.g. with AES-GCM)")  # fmt: skip
    if model_path is None:
        from epctx.trust.verify import refuse_or_warn

        refuse_or_warn(policy, {"<model bytes>": model_native or any(files.values())}, {}, "",
                        "a model given as bytes has no folder a signature could cover")  # fmt: skip
        return {}
    required: dict[Path, bool] = {**files, model_path: model_native}  # binaries first: refusals name them
    setting = _Setting.of(model_path, config)
    handed = _HANDED.pop(setting.handing(model_path), None)
    record = handed.record if handed is not None else setting.record(model_path)
    stamps = record.stamps(required)
    known = handed.known if handed is not None else record.read()  # the package's look-up, or this one
    if matches(known, stamps):  # verified before, and nothing involved was written since
        for key, notes in record.notes.items():  # what the hashing pass verified then stands too
            if hasher is not None and stamps.get(key) is not None:
                hasher.remember(tuple(stamps[key]), notes)  # type: ignore[arg-type]
        return stamps
    if not _same_setting(known, stamps, setting):  # another signature or key set: everything again
        known, handed = {}, None
    todo = {p: n for p, n in required.items() if not matches(known, {str(p): stamps[str(p)]})}
    manifest = handed.manifest if handed is not None else None
    notes = {k: v for k, v in record.notes.items() if known and k in stamps}  # unchanged files' notes stand
    from epctx.trust.verify import checked

    if checked(todo, setting, record, {**known, **stamps}, manifest, hasher, notes):
        return stamps
    return {}  # warn / require-native: what loaded unsigned is not compared later


def check_package_files(manifest: Path, model: Path, config: opt.SessionConfig) -> None:
    """A package session's check, before it reads a byte of the variant: the package's manifest and the
    variant's model file. One record look-up serves the whole session: the package's record also covers the
    variant's binaries (once verified), and what this check found is handed to the session's loader, whose
    check then reads nothing more while nothing changed."""
    if config.trust_policy == "off":
        return
    setting = _Setting.of(manifest, config)
    record = setting.record(manifest)
    required = {model: False, manifest: False}
    stamps = record.stamps(required)
    known = record.read()
    handed = _Handed(record, known, None)
    if not matches(known, stamps):
        from epctx.trust.verify import refuse_or_warn, verify_files

        reasons, signer, verified = verify_files(required, setting)
        if reasons:
            natives = {str(path): native for path, native in required.items() if str(path) in reasons}
            refuse_or_warn(setting.policy, natives, reasons, str(setting.signature), "")
            return  # warn: nothing handed, the loader checks on its own
        record.save(stamps, [str(p) for p in required], signer, verified.valid_until if verified else None)
        handed = _Handed(record, stamps, verified)
    _HANDED[setting.handing(model)] = handed


def _same_setting(
    known: Mapping[str, list[int] | None], now: Mapping[str, list[int] | None], setting: _Setting
) -> bool:
    """The signature and the keys are the files the handed manifest was verified from."""
    return matches(known, {p: now[p] for p in setting.watched})
