"""Compile processes that die with the process that asked for them, and the job folders of dead processes.

A compile runs in a worker process (``worker.py``), which runs ``iree-compile``: a compile killed with its
caller (SIGKILL, an OOM kill) would otherwise leave both running for up to the compile timeout, and the job
folder (a copy of the partition's weights) in ``$TMPDIR``.

- ``die_with_parent(pid)``: on Linux, ``PR_SET_PDEATHSIG``: the kernel sends SIGKILL to this process when its
  parent ends; a parent already gone (``getppid()`` is no longer ``pid``) ends it at once. The worker calls it
  first thing; ``iree-compile`` gets it from this module run as a script, which then ``exec``s the tool (the
  signal setting survives ``exec``): ``python lifeline.py <parent pid> <program> <args...>``.
- ``job_folder()`` / ``remove_stale_folders()``: job folders are named ``epctx-iree-<owner pid>-<random>`` and
  locked by their owner while in use; a compile removes those whose owner is gone: its pid is not alive and the
  lock is free (this user's plain folders only; never a live process's, in this pid namespace or another).

This file imports nothing of epctx: it runs as a script, before ``iree-compile`` starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import re
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator

__all__ = ["die_with_parent", "job_folder", "remove_stale_folders", "with_parent"]

PREFIX = "epctx-iree-"
_PR_SET_PDEATHSIG = 1
_FOLDER = re.compile(re.escape(PREFIX) + r"(\d+)-[^/]+\Z")


def die_with_parent(parent: int) -> None:
    """Be killed (SIGKILL) when the parent process ``parent`` ends; exit now when it has ended already.
    Nothing happens where the kernel offers no such setting (not Linux)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the parent ended before the setting was made
        os._exit(1)


def with_parent(command: list[str]) -> list[str]:
    """``command`` run so that it dies with this process (through this file run as a script)."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()), *command]


@contextlib.contextmanager
def job_folder() -> Iterator[str]:
    """A new job folder in ``$TMPDIR``, named for this process and locked (``flock``) while in use; removed
    after."""
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
    lock = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(lock)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _remove_if_unowned(path: str) -> bool:
    """Remove ``path`` when it is this user's folder and no process holds its lock (the lock goes with its
    process, whatever its pid namespace)."""
    try:
        lock = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        if os.fstat(lock).st_uid != os.getuid():
            return False
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: a compile is using it
        os.close(lock)
        return False
    try:
        shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(lock)
    return True


def remove_stale_folders(parent: str | None = None) -> list[str]:
    """Remove the job folders in ``parent`` (``$TMPDIR``) whose owner process is gone (its pid is not alive and
    nothing holds the folder's lock); returns their paths. Only this user's folders named
    ``epctx-iree-<pid>-...`` are looked at; anything unreadable is left."""
    parent = parent or tempfile.gettempdir()
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    removed = []
    for name in names:
        found = _FOLDER.match(name)
        if found is None or _alive(int(found.group(1))):
            continue
        path = os.path.join(parent, name)
        if _remove_if_unowned(path):
            removed.append(path)
    return removed


def _main(argv: list[str]) -> None:
    parent, program = int(argv[0]), argv[1:]
    die_with_parent(parent)
    os.execv(program[0], program)


if __name__ == "__main__":
    _main(sys.argv[1:])
