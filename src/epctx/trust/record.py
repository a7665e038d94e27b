"""The verification record: what was verified, so that a warm session does not hash again.

One small file per (model, signature, keys) in the user's cache (``EPCTX_TRUST_RECORDS``, else
``$XDG_CACHE_HOME/epctx/trust`` or ``~/.cache/epctx/trust``), mode 0600. It lists, for every file involved
(the covered files, the signature, the trusted keys), device, inode, size and ctime in nanoseconds. A write
to a file changes its ctime (and a replacement its inode), and no user can set a ctime back, so a record that
still matches means nothing changed since the files were verified; anything else is a full verification.
Only successes are recorded. Whoever can write the record folder is the user themself: the record is as safe
as the user's own cache."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["Record", "record_dir"]

logger = logging.getLogger("epctx")
_VERSION = 1


def record_dir() -> Path:
    given = os.environ.get("EPCTX_TRUST_RECORDS")
    if given:
        return Path(given)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "epctx" / "trust"


def _stamp(path: Path) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns]


class Record:
    """The record of one (model, signature, keys, policy) combination."""

    def __init__(self, model: Path, signature: Path, keys: Sequence[Path], policy: str) -> None:
        self.signature = signature
        self.keys = list(keys)
        ident = json.dumps(
            [os.path.realpath(model), os.path.realpath(signature), sorted(map(str, keys)), policy]
        )
        self.path = record_dir() / f"{hashlib.sha256(ident.encode()).hexdigest()[:32]}.json"

    def covers(self, files: Iterable[Path]) -> tuple[str, ...] | None:
        """The names of the files the record says were verified as signed, when every one of ``files``, the
        signature and the keys are unchanged since; else None."""
        try:
            data = json.loads(self.path.read_bytes())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("version") != _VERSION:
            return None
        stamps = data.get("stamps", {})
        for path in (*files, self.signature, *self.keys):
            now = _stamp(path)
            if now is None or stamps.get(str(path)) != now:
                return None
        return tuple(data.get("signed", ()))

    def stamps(self, files: Iterable[Path]) -> dict[str, list[int] | None]:
        """Taken before verifying: a file written while it is hashed then fails the next ``covers``."""
        return {str(p): _stamp(p) for p in (*files, self.signature, *self.keys)}

    def save(self, stamps: dict[str, list[int] | None], signed: Iterable[str], signer: str) -> None:
        if any(v is None for v in stamps.values()):
            return
        body = json.dumps({"version": _VERSION, "stamps": stamps, "signed": sorted(signed), "signer": signer})
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with open(fd, "w") as fh:
                fh.write(body)
            os.replace(tmp, self.path)
        except OSError as exc:  # no record: the next session verifies again
            logger.debug("epctx.trust: cannot keep a verification record in %s: %s", self.path.parent, exc)
