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
started have happened, and waits for them (bounded) before it returns, so that neither the importing
thread nor any other thread has a multi-threaded BLAS call in flight when they come. The CPU kernels
that call BLAS check :func:`settle` when they are built (a set lookup), which covers a backend that the
user imported directly. Nothing here runs at ``import epctx`` or in ``run()``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["FORKING_BACKENDS", "backend_import", "settle", "thread_limit"]

_log = logging.getLogger("epctx")

# Backends whose import starts a fork from another thread (OpenVINO: its telemetry).
FORKING_BACKENDS = ("openvino",)

# The telemetry forks within milliseconds of the import; this bounds the wait on a loaded machine (and when
# the send is pending but cannot be observed). OpenVINO's telemetry itself waits up to 3 s for its child.
FORK_WAIT_S = 2.0

_settled: set[str] = set()  # backends imported and past their import-time forks
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


@contextlib.contextmanager
def _single_threaded_blas() -> Iterator[None]:
    import numpy  # noqa: F401  (loads its BLAS, so that the limit below covers it)

    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # not installed: the importing thread still waits for the forks
        yield
        return
    limiter = ThreadpoolController().limit(limits=1, user_api="blas")
    try:
        yield
    finally:
        limiter.restore_original_limits()


@contextlib.contextmanager
def backend_import(name: str) -> Iterator[None]:
    """Context for ``import <name>`` (a package in :data:`FORKING_BACKENDS`) that cannot hang numpy's BLAS.

    The first time: BLAS single-threaded during the import, then a wait (at most :data:`FORK_WAIT_S`) until
    the forks the import started are done. Afterwards: nothing (a set lookup)."""
    if name in _settled:
        yield
        return
    with _lock:
        if name in _settled:
            yield
            return
        _register_fork_hook()
        forks_before = _forks
        with _single_threaded_blas():
            yield
            if not _wait_for_forks(forks_before):
                _log.debug("%s: no import-time fork seen within %.1f s", name, FORK_WAIT_S)
        _settled.add(name)  # once per process, whatever came of the wait


def settle() -> None:
    """Cheap check for kernels that call BLAS: a forking backend imported outside :func:`backend_import`
    (by the user) gets the same wait once."""
    for name in FORKING_BACKENDS:
        if name not in _settled and name in sys.modules:
            with backend_import(name):
                pass


_controller: Any = None  # threadpoolctl's ThreadpoolController, made at the first limited run


@contextlib.contextmanager
def thread_limit(threads: int) -> Iterator[None]:
    """numpy's BLAS limited to ``threads`` threads inside the block (a session's ``intra_op_num_threads``).
    Process-wide while it lasts, as BLAS's own setting is; without threadpoolctl, a warning and no limit."""
    global _controller
    if _controller is None:
        with _lock:
            try:
                from threadpoolctl import ThreadpoolController
            except ImportError:
                _log.warning(
                    "intra_op_num_threads=%d needs threadpoolctl (pip install threadpoolctl)", threads
                )
                yield
                return
            if _controller is None:
                _controller = ThreadpoolController()
    limiter = _controller.limit(limits=threads, user_api="blas")
    try:
        yield
    finally:
        limiter.restore_original_limits()
