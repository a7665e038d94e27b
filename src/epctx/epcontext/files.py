"""Files epctx writes: atomically, through temporary files whose names say which process writes them."""

from __future__ import annotations

import errno
import os
import re
import secrets
from pathlib import Path

from epctx.ep._files import fsync_folder, write_file_atomic
from epctx.errors import EPCtxError, Fail, InvalidArgument

__all__ = [
    "TEMP_PATTERN",
    "check_writable",
    "fsync_folder",
    "is_stale_temp",
    "temp_writer_pid",
    "write_file_atomic",
]

# ``.<binary name>.<writer pid>.<random hex>.tmp``: what ContextBinaryWriter.write writes before renaming.
TEMP_PATTERN = re.compile(
    r"\.(?P<name>.+)\.(?P<pid>[1-9][0-9]{0,9})\.(?P<token>[0-9a-f]{12})\.tmp", re.DOTALL
)


def check_writable(path: str | os.PathLike[str], *, what: str) -> bool:
    """Before any compile: ``path`` can be written. Its nearest existing folder must accept a new file, which is
    probed (a temporary file of ``TEMP_PATTERN``'s form created and removed at once), so what permission bits
    do not tell counts too: a read-only file system, a folder that refuses even root. A folder at ``path`` is
    InvalidArgument; anything the file system refuses is Fail naming the path and the reason, as onnxruntime.
    Returns whether ``path`` exists already (the caller decides whether it may be replaced)."""
    target = Path(path)
    shown = os.fspath(path)
    try:
        if target.is_dir():
            raise InvalidArgument(f"{what} {shown!r} is a folder, expected a file path")
        exists = target.exists()
        folder = target.parent if str(target.parent) else Path(".")
        existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))
        if not existing.is_dir():
            raise Fail(f"cannot write {what} {shown!r}: {os.fspath(existing)!r} is not a folder")
        probe = existing / f".{target.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.unlink(probe)
    except EPCtxError:
        raise
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise Fail(f"cannot write {what} {shown!r}: {reason} ({exc.filename or shown!r})") from exc
    return exists


def temp_writer_pid(path: str | os.PathLike[str]) -> int | None:
    """The process id of the writer whose temporary file ``path`` is (a name ``ContextBinaryWriter.write``
    gives: ``.<binary name>.<pid>.<12 hex digits>.tmp``), else None."""
    match = TEMP_PATTERN.fullmatch(os.path.basename(os.fspath(path)))
    return int(match["pid"]) if match else None


def is_stale_temp(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a context binary writer's temporary file whose writer process no longer runs on this
    machine (killed mid-write; a finished or failed write leaves none). False for any other name, and where
    it cannot be told (Windows; a writer that runs as another user counts as running). A reused process id
    reads as running: never stale by mistake, at worst kept until that process ends. Only the name and the
    process table are looked at: the caller decides what to remove, and when."""
    pid = temp_writer_pid(path)
    if pid is None or os.name != "posix":
        return False
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    except OSError as exc:
        return exc.errno == errno.ESRCH
    return False
