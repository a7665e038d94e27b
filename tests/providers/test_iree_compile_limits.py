"""What stops an IREE compile before its end. Each ``iree-compile`` runs under a cap on its resident memory (provider option ``compile_memory_mb``; by
default half the machine's memory shared among the compiles running at once): one past it is stopped and fails
with stage ``memory``, its nodes declined saying so, and that outcome is kept nowhere (a larger cap tries the
compile again). IREE 3.13 never finished compiling silero-vad's folded LSTM decoder in pieces: 23 GB in 26 s,
two such compiles at once, until the kernel's OOM killer ended one. And a capability check's compiles after its
first end with its budget: one still running then is stopped (stage ``budget``), its worker and ``iree-compile``
with it, and kept nowhere either."""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from benchmarks.models import mlp

import epctx
from epctx.ep import CompileGuard, make_partition
from epctx.providers.iree import compile as iree_compile
from epctx.providers.iree.compile import BUDGET_STAGE, compile_partitions, memory_cap
from epctx.providers.iree.worker import run_capped
from tests.oracle import run_ort
from tests.requires import requires

_GROW = "import time; kept = b'x' * (400 << 20); time.sleep(60)"  # 400 MB written: resident


def test_a_process_past_its_cap_is_stopped_soon(tmp_path: Path) -> None:
    start = time.perf_counter()
    status, _, over = run_capped([sys.executable, "-c", _GROW], tmp_path, 100)
    assert over and status != 0
    assert time.perf_counter() - start < 20  # stopped, not left to sleep its minute


def test_a_process_under_its_cap_runs_to_its_end(tmp_path: Path) -> None:
    assert run_capped([sys.executable, "-c", "print('done')"], tmp_path, 1000) == (0, "done\n", False)
    code = "import sys; sys.stderr.write('failed'); sys.exit(3)"
    assert run_capped([sys.executable, "-c", code], tmp_path, 0) == (3, "failed", False)  # 0: no cap


def test_the_default_cap_shares_half_the_memory() -> None:
    one, two = memory_cap(1), memory_cap(2)
    assert one >= two >= 2048
    assert one <= max(2048, two * 2)


@pytest.mark.slow
@requires("iree.runtime", "iree.compiler")
def test_a_compile_past_the_cap_declines_its_nodes_and_a_larger_cap_compiles_them(tmp_path: Path) -> None:
    model = mlp(batch=2, sizes=(8, 16, 4))
    path = tmp_path / "mlp.onnx"
    path.write_bytes(model.SerializeToString())
    capped = epctx.InferenceSession(
        str(path), providers=[("IREEExecutionProvider", {"compile_memory_mb": "40"})]
    )
    assert {ep for ep, _ in capped.get_partitions()} == {"CPUExecutionProvider"}
    reasons = {why["IREEExecutionProvider"] for why in capped.get_fallback_reasons().values()}
    assert reasons and all("compile_memory_mb" in why and "40 MiB" in why for why in reasons), reasons
    feed = {"input": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
    np.testing.assert_allclose(capped.run(None, feed)[0], run_ort(model, feed)[0], rtol=1e-5, atol=1e-6)
    whole = epctx.InferenceSession(
        str(path), providers=["IREEExecutionProvider"]
    )  # nothing kept from the above
    assert [ep for ep, _ in whole.get_partitions()] == ["IREEExecutionProvider"]


def _iree_compiles(folder: Path) -> set[int]:
    """The pids of the live (not zombie) iree-compile processes running in ``folder`` (their job folders are
    there; other tests' compiles, under ``make test``'s parallel workers, are elsewhere)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == "iree-compile":
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                inside = os.readlink(entry / "cwd").startswith(str(folder))
                found |= {int(entry.name)} if state != "Z" and inside else set()
        except OSError:
            continue
    return found


class _Watch:
    """The iree-compile processes seen in ``folder`` while a block runs, and when the first appeared."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.seen, self.first = folder, set[int](), None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        start = time.perf_counter()
        while not self._stop.is_set():
            found = _iree_compiles(self.folder)
            if found and self.first is None:
                self.first = time.perf_counter() - start
            self.seen |= found
            time.sleep(0.02)

    def __enter__(self) -> _Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.slow
@requires("iree.runtime", "iree.compiler")
def test_a_compile_still_running_at_the_deadline_is_stopped_and_kept_nowhere(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Timed on a first compile run to its end: the second one's deadline falls halfway through its iree-compile,
    which must then be running, and must not outlive its stopped worker."""
    import onnx_ir as ir
    from benchmarks.models import resnet18

    from epctx.providers.iree.provider import IREEExecutionProvider

    flags = IREEExecutionProvider().flags()
    monkeypatch.setattr(iree_compile, "_CACHE", {})
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the job folders: where its iree-compile runs
    model = resnet18(image=64, widths=(32, 64, 64, 64), blocks=(2, 2, 2, 2), num_classes=10)
    graph = ir.from_proto(model).graph
    partition = make_partition("p", "IREEExecutionProvider", graph, list(graph), {"": 17})
    with _Watch(tmp_path) as whole:
        start = time.perf_counter()
        [done] = compile_partitions([partition], flags, CompileGuard())
        total = time.perf_counter() - start
    assert done.ok, done.error
    assert whole.first is not None and not _iree_compiles(tmp_path)
    iree_compile._CACHE.clear()
    with _Watch(tmp_path) as stopped:
        start = time.perf_counter()
        [result] = compile_partitions(
            [partition], flags, CompileGuard(), deadline=start + (whole.first + total) / 2
        )
        assert stopped.seen, "iree-compile was not running when the deadline came"
    assert result.stage == BUDGET_STAGE and not result.ok and "capability_budget_s" in result.error
    assert time.perf_counter() - start < total  # stopped, not run to its end
    assert not iree_compile._CACHE
    time.sleep(0.5)  # iree-compile gets its SIGKILL when its worker ends
    assert not _iree_compiles(tmp_path), "an iree-compile outlived its stopped worker"


def test_a_stopped_compile_is_not_kept_in_the_probe_records(tmp_path: Path) -> None:
    from epctx.providers.iree.compile import CompileResult
    from epctx.providers.iree.probe_cache import ProbeCache
    from epctx.providers.iree.worker import MEMORY_STAGE

    records = ProbeCache(tmp_path)
    for key, stage in (("a" * 64, MEMORY_STAGE), ("b" * 64, BUDGET_STAGE)):
        records.put(key, CompileResult(False, stage=stage, error="stopped", seconds=1.0), [])
        assert records.get(key) is None
    records.put("c" * 64, CompileResult(False, stage="compile", error="error: no", seconds=1.0), [])
    kept = records.get("c" * 64)
    assert kept is not None and kept.error == "error: no"
