"""The verification record: what was verified, so that a warm session does not hash again.

One small file per (model, signature, trusted keys, policy) in the user's cache (``EPCTX_TRUST_RECORDS``, else
``trust`` in epctx's cache folder, ``epctx.ep.user_cache_dir``: ``$EPCTX_CACHE_DIR``, ``$XDG_CACHE_HOME/epctx`` or
``~/.cache/epctx``), mode 0600. It lists, for every file involved
(the covered files, the signature, the trusted keys), device, inode, size and ctime in nanoseconds. A write
to a file changes its ctime (and a replacement its inode), and no user can set a ctime back, so a record that
still matches means nothing changed since the files were verified; anything else is a full verification.
Only successes are recorded. Whoever can write the record folder is the user themself: the record is as safe
as the user's own cache."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from epctx.ep._files import user_cache_dir

__all__ = ["Record", "matches", "record_dir", "stamp"]

logger = logging.getLogger("epctx")
_VERSION = 2


def record_dir() -> Path:
    given = os.environ.get("EPCTX_TRUST_RECORDS")
    if given:
        return Path(given)
    return user_cache_dir("trust")


def stamp(path: Path | str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns]


def matches(known: Mapping[str, list[int] | None], now: Mapping[str, list[int] | None]) -> bool:
    """Whether every stamp taken ``now`` is the one ``known`` (verified) holds: no file missing, none written."""
    return all(v is not None and known.get(k) == v for k, v in now.items())


class Record:
    """The record of one (model, signature, trusted keys, policy, root) combination. ``watched``: the signature
    and the key files, stamped with the covered files; ``about``: what the record is about besides the model (the
    signature, the exact key set, the policy, the root), compared whole: a key removed from the set voids it."""

    def __init__(self, model: Path | str, watched: Sequence[str], about: str, policy: str) -> None:
        self.watched = tuple(watched)
        self.notes: dict[str, object] = {}  # what the record's hasher noted per file (``read`` fills it)
        self.ident = f"{os.path.abspath(model)}\n{about}"
        # The file name only indexes the record, by the model file's device and inode: no hash module to import
        # (hashlib's import alone costs more than a warm session here).
        now = stamp(model)
        where = f"{now[0]:x}-{now[1]:x}" if now is not None else "none"
        self.path = record_dir() / f"{where}-{policy}.json"

    def covers(self, now: Mapping[str, list[int] | None]) -> bool:
        """Whether the record says these files (``stamps`` of the required files, the signature and the keys,
        taken now) were verified as signed, none written since."""
        return matches(self.read(), now)

    def read(self) -> dict[str, list[int] | None]:
        """The stamps the record holds (every file it verified, which may be more than a caller asks about:
        a package's record covers its variant's binaries too); empty when there is none or it is not this
        combination's. One file read: the record look-up."""
        try:
            data = json.loads(self.path.read_bytes())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("version") != _VERSION or data.get("ident") != self.ident:
            return {}
        until = data.get("valid_until")  # a certificate's end of validity: verified again after it
        if until is not None and (not isinstance(until, (int, float)) or time.time() >= until):
            return {}
        recorded = data.get("stamps")
        notes = data.get("notes")
        self.notes = notes if isinstance(notes, dict) else {}
        return recorded if isinstance(recorded, dict) else {}

    def stamps(self, files: Iterable[Path | str]) -> dict[str, list[int] | None]:
        """Taken before verifying: a file written while it is hashed then fails the next ``covers``."""
        return {str(p): stamp(p) for p in (*files, *self.watched)}

    def save(
        self,
        stamps: dict[str, list[int] | None],
        signed: Iterable[str],
        signer: str,
        valid_until: float | None = None,
        notes: Mapping[str, object] | None = None,
    ) -> None:
        """``valid_until``: POSIX time after which the verdict no longer holds (the signing certificate's chain
        expires): the record is void then, and the next session verifies (and refuses) again. ``notes``: per file,
        what the hasher verified besides the digest (``digests.Hasher``), handed back to it on a warm session."""
        if any(v is None for v in stamps.values()):
            return
        body = json.dumps(
            {
                "version": _VERSION,
                "ident": self.ident,
                "stamps": stamps,
                "signed": sorted(signed),
                "signer": signer,
                "valid_until": valid_until,
                "notes": dict(notes or {}),
            }
        )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with open(fd, "w") as fh:
                fh.write(body)
            os.replace(tmp, self.path)
        except OSError as exc:  # no record: the next session verifies again
            logger.debug("epctx.trust: cannot keep a verification record in %s: %s", self.path.parent, exc)
