"""numpy's BLAS thread pool versus backends that fork at import: the one place that coordinates them.

Why (issue 7): ``import openvino`` imports ``openvino.tools.ovc``, whose telemetry sends an event from a
``ThreadPoolExecutor`` thread through ``multiprocessing.Process``, i.e. ``os.fork()``, 1-5 ms after the
import returns (when the user has not opted out, the default). ``fork()`` runs OpenBLAS's
``pthread_atfork`` handler ``blas_thread_shutdown_``, which stops the BLAS worker threads with no
synchronisation against a multi-threaded BLAS call (``exec_blas``) that another thread has in flight:

- the worker is busy with that call: it finishes, clears its queue slot (erasing the shutdown request)
  and goes to sleep; the handler's ``pthread_join`` never returns, the forking thread holds the GIL, and
  the caller of the BLAS call waits for the GIL forever. Seen with gdb in every hung process here:
  telemetry thread in ``__libc_fork`` -> ``blas_thread_shutdown_`` -> ``pthread_join``, worker in
  ``pthread_cond_wait`` with ``thread_status[0] = {queue: 0, status: SLEEP}``, main thread in
  ``take_gil`` after ``np.matmul``;
- the other order (the issue's 100% CPU stacks in ``exec_blas``): the worker takes the shutdown request
  instead of the job and exits, and the caller spins on a queue slot that never clears.

Single-threaded BLAS (``OPENBLAS_NUM_THREADS=1``) never enters ``exec_blas``, hence never hangs.

What epctx does: a backend that forks at import is imported through :func:`backend_import`, which
limits numpy's BLAS to one thread (threadpoolctl) from just before the import until the forks the import
started have happened, so that no thread has a multi-threaded BLAS call in flight when they come. The
importing thread does not wait for them: a daemon thread does (bounded), then gives BLAS its threads back.
So the backend's own work (``import_model``; the fork came up to ~100 ms after the import on this loaded
machine) overlaps the wait, as in a process that imports the backend itself. The CPU kernels that call
BLAS check :func:`settle` when they are built (a set lookup once settled), which joins that wait and covers
a backend that the user imported directly. Nothing here runs at ``import epctx`` or in ``run()``.

Part of ``epctx.ep`` (every EP that imports a forking backend, or runs numpy's BLAS, uses it): imported on
first use, as ``epctx.ep.backend_import``, ``epctx.ep.settle_backends`` and ``epctx.ep.blas_thread_limit``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["FORKING_BACKENDS", "backend_import", "settle", "thread_limit"]

_log = logging.getLogger("epctx")

# Backends whose import starts a fork from another thread (OpenVINO: its telemetry).
FORKING_BACKENDS = ("openvino",)

# The telemetry forks within milliseconds of the import; this bounds the wait on a loaded machine (and when
# the send is pending but cannot be observed). OpenVINO's telemetry itself waits up to 3 s for its child.
FORK_WAIT_S = 2.0

_settled: set[str] = set()  # backends imported and past their import-time forks
_settlers: dict[str, _Settler] = {}  # the threads that wait for them (started once per backend)
_lock = threading.RLock()
_forks = 0  # forks (os.fork, as multiprocessing does) seen in the parent since the hook was registered
_hook_registered = False


def _count_fork() -> None:
    global _forks
    _forks += 1


def _register_fork_hook() -> None:
    global _hook_registered
    if not _hook_registered:
        os.register_at_fork(after_in_parent=_count_fork)
        _hook_registered = True


def _telemetry_sends_in_flight() -> int | None:
    """OpenVINO telemetry sends queued or running (each forks once); 0 without telemetry; None if unknown."""
    main = sys.modules.get("openvino_telemetry.main")
    if main is None:
        return 0
    try:
        telemetry = getattr(main.Telemetry, "_SingletonMetaClass__single_instance", None)
        if telemetry is None:
            return 0  # never instantiated: nothing sent
        sender = getattr(telemetry, "sender", None)
        return 0 if sender is None else int(sender.queue_size)
    except (AttributeError, TypeError, ValueError):  # another openvino-telemetry version
        return None


def _wait_for_forks(forks_before: int) -> bool:
    """Wait until every telemetry send in flight has forked or finished; False if the bound ran out."""
    deadline = time.monotonic() + FORK_WAIT_S
    while True:
        pending = _telemetry_sends_in_flight()
        if pending == 0:
            return True
        if _forks - forks_before >= (1 if pending is None else pending):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)  # releases the GIL: the sender thread needs it to fork


def _limit_blas() -> Callable[[], None] | None:
    """Limit numpy's BLAS to one thread; the function that restores it, or None without threadpoolctl."""
    import numpy  # noqa: F401  (loads its BLAS, so that the limit below covers it)

    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    limiter = ThreadpoolController().limit(limits=1, user_api="blas")
    restore: Callable[[], None] = limiter.restore_original_limits
    return restore


@contextlib.contextmanager
def backend_import(name: str) -> Iterator[None]:
    """Context for ``import <name>`` (a package in :data:`FORKING_BACKENDS`) that cannot hang numpy's BLAS.

    The first time: BLAS single-threaded from here until the forks the import started are done, which a
    daemon thread waits for (at most :data:`FORK_WAIT_S`) before restoring BLAS's threads; :func:`settle`
    joins it. Afterwards: nothing (a set lookup)."""
    if name in _settled or name in _settlers:
        yield
        return
    with _lock:
        if name in _settled or name in _settlers:
            yield
            return
        _register_fork_hook()
        forks_before = _forks
        settler = _Settler(name)
        try:
            yield
        except BaseException:
            settler.done(None)  # the import failed: nothing of it to wait for
            raise
        _settlers[name] = settler
        settler.done(forks_before)


class _Settler(threading.Thread):
    """Limits BLAS to one thread, then (once told the import is done) waits for the forks it started and
    restores BLAS's threads. Both from this thread: numpy's OpenBLAS (0.3.31, measured) ignores a restore made
    from a thread other than the one that set the limit."""

    def __init__(self, name: str) -> None:
        super().__init__(name=f"epctx-{name}-forks", daemon=True)
        self.backend = name
        self._limited = threading.Event()
        self._imported = threading.Event()
        self._forks_before: int | None = None
        self.limits = False  # whether BLAS was limited (threadpoolctl installed)
        self.start()
        self._limited.wait()

    def done(self, forks_before: int | None) -> None:
        """The import returned (``forks_before``: the fork count before it) or failed (None)."""
        self._forks_before = forks_before
        self._imported.set()
        if forks_before is None or not self.limits:  # without the limit, the importing thread waits
            self.join()

    def run(self) -> None:
        restore = None
        try:
            restore = _limit_blas()
            self.limits = restore is not None
        except Exception as exc:  # threadpoolctl could not reach the BLAS: the importing thread waits instead
            _log.debug("%s: BLAS threads not limited for the import (%s)", self.backend, exc)
        finally:
            self._limited.set()
        self._imported.wait()
        try:
            if self._forks_before is not None and not _wait_for_forks(self._forks_before):
                _log.debug("%s: no import-time fork seen within %.1f s", self.backend, FORK_WAIT_S)
        finally:
            if restore is not None:
                restore()  # BLAS gets its threads back only once the forks are done
            if self._forks_before is not None:
                _settled.add(self.backend)  # once per process, whatever came of the wait


def settle() -> None:
    """For kernels that call BLAS: wait until every forking backend that is imported is past its import-time
    forks with BLAS's threads restored. A backend imported outside :func:`backend_import` (by the user) gets
    the same wait once; afterwards this is a set lookup."""
    for name in FORKING_BACKENDS:
        if name in _settled:
            continue
        if name not in _settlers and name in sys.modules:
            with backend_import(name):
                pass
        settler = _settlers.get(name)
        if settler is not None:
            settler.join()


# threadpoolctl's ThreadpoolController (made at the first limited run) and len(sys.modules) when it was made: it
# knows the BLAS libraries loaded then, so it is made again after imports (scipy, torch... may load another BLAS,
# which a stale controller would leave unlimited); len(sys.modules) is a cheap sign that something was imported.
_controller: Any = None
_modules_seen = -1


@contextlib.contextmanager
def thread_limit(threads: int) -> Iterator[None]:
    """numpy's BLAS (and every other BLAS loaded) limited to ``threads`` threads inside the block (a session's
    ``intra_op_num_threads``). Process-wide while it lasts, as BLAS's own setting is; without threadpoolctl, a
    warning and no limit."""
    global _controller, _modules_seen
    settle()  # not above one thread while a backend's import-time fork may still come
    if _controller is None or len(sys.modules) != _modules_seen:
        with _lock:
            try:
                from threadpoolctl import ThreadpoolController
            except ImportError:
                _log.warning(
                    "intra_op_num_threads=%d needs threadpoolctl (pip install threadpoolctl)", threads
                )
                yield
                return
            if _controller is None or len(sys.modules) != _modules_seen:
                _controller = ThreadpoolController()
                _modules_seen = len(sys.modules)
    limiter = _controller.limit(limits=threads, user_api="blas")
    try:
        yield
    finally:
        limiter.restore_original_limits()
