"""``epctx.ep.blas_thread_limit`` (a session's ``intra_op_num_threads``) limits every BLAS loaded at the time of
the run, including one loaded after the first limited run (scipy and torch bring their own): the controller
made at the first run knew only the libraries loaded then, and left a later one at its own thread count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_CHILD = """
import json, numpy, threadpoolctl
from epctx.ep import blas_thread_limit
with blas_thread_limit(1):  # the first limited run: only numpy's BLAS is loaded
    pass
import scipy.linalg  # scipy's own OpenBLAS
with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
    with blas_thread_limit(1):
        inside = {i["filepath"]: i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"}
    after = {i["filepath"]: i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"}
print(json.dumps([inside, after]))
"""


def test_a_blas_loaded_after_the_first_limited_run_is_limited_too() -> None:
    pytest.importorskip("threadpoolctl")
    pytest.importorskip("scipy")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    inside, after = json.loads(done.stdout)
    if len(inside) < 2:
        pytest.skip(f"scipy shares numpy's BLAS here ({list(inside)})")
    assert set(inside.values()) == {1}, inside
    assert set(after.values()) == {2}, after  # each library's own setting restored
