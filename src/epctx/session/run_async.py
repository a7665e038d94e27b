"""``InferenceSession.run_async``: the run on a worker thread, then ``callback(outputs, user_data, err)``.

As onnxruntime calls it: ``outputs`` a list of numpy arrays and ``err`` "" on success; ``outputs`` empty and
``err`` the error's message on failure. One pool per process, made at the first call."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["submit"]

logger = logging.getLogger("epctx")

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="epctx-run-async"
            )
        return _pool


def submit(
    run: Callable[[], list[Any]], callback: Callable[[list[Any], Any, str], None], user_data: Any
) -> concurrent.futures.Future[None]:
    def job() -> None:
        try:
            outputs = run()
        except Exception as exc:  # the callback receives every failure, as onnxruntime's does
            outputs, err = [], str(exc)
        else:
            err = ""
        try:
            callback(outputs, user_data, err)
        except Exception:
            logger.exception("run_async: the callback raised")

    return _executor().submit(job)
