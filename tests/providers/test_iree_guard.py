"""The single guarded compile point with real IREE: a session that must not compile starts no IREE compile worker
(its capability probes compile too), and the partitions of one model compile in one call, in parallel workers,
reported one by one."""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import epctx
from epctx.providers.iree.provider import IREEExecutionProvider
from epctx.testing import NO_COMPILE_ENV, no_compile
from tests.oracle import run_ort
from tests.requires import requires

pytestmark = requires("iree.runtime", "iree.compiler")

EP = "IREEExecutionProvider"


def _model(ops: tuple[str, ...]) -> onnx.ModelProto:
    nodes = [
        helper.make_node(op, [f"v{k}"], [f"v{k + 1}" if k + 1 < len(ops) else "y"], name=f"n{k}")
        for k, op in enumerate(ops)
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("v0", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[str]]]:
    """The command of every process started from Python in this process (IREE's workers are)."""
    seen: list[list[str]] = []

    class Spy(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, args, *rest, **kwargs):  # type: ignore[no-untyped-def]
            seen.append([str(a) for a in args])
            super().__init__(args, *rest, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", Spy)
    yield seen


def _refused(path: Path, way: str, monkeypatch: pytest.MonkeyPatch) -> float:
    """Create an IREE session over ``path`` that must not compile (``way``); returns the seconds to refuse."""
    so = epctx.SessionOptions()
    if way == "disable_model_compile":
        so.add_session_config_entry("session.disable_model_compile", "1")
    if way == "env":
        monkeypatch.setenv(NO_COMPILE_ENV, "1")
    start = time.perf_counter()
    with pytest.raises(
        epctx.ModelRequiresCompilation, match=f"{EP} was asked to compile 1 partition"
    ) as info:
        if way == "no_compile":
            with no_compile():
                epctx.InferenceSession(str(path), so, providers=[EP])
        else:
            epctx.InferenceSession(str(path), so, providers=[EP])
    seconds = time.perf_counter() - start
    assert "for its capability check" in str(info.value)  # refused at the probe, before partitioning ends
    return seconds


@pytest.mark.parametrize("way", ["disable_model_compile", "no_compile", "env"])
def test_a_session_that_must_not_compile_starts_no_iree_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, started: list[list[str]], way: str
) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_model(("Relu", "Neg")), path)
    _refused(path, way, monkeypatch)  # the first one pays for the imports (onnx-ir, the IREE EP's modules)
    seconds = min(_refused(path, way, monkeypatch) for _ in range(3))
    assert seconds < 0.3, f"refused after {seconds:.3f} s"
    assert started == [], f"processes started: {started}"


@pytest.mark.slow  # compiles with IREE
def test_partitions_of_one_ep_compile_in_one_call_in_parallel(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, started: list[list[str]]
) -> None:
    """Relu -> Neg -> Relu with Neg disabled (and no cost rule): two IREE partitions around a CPU node. The
    capability check compiles the two partitions the framework will form (in two workers, in parallel; both
    Relus as one set are no partition, so that set is not compiled); the compile, one call for both, reuses them
    and reports progress per partition."""
    calls: list[int] = []
    original = IREEExecutionProvider.compile

    def spy(self, partitions, ctx):  # type: ignore[no-untyped-def]
        calls.append(len(partitions))
        return original(self, partitions, ctx)

    monkeypatch.setattr(IREEExecutionProvider, "compile", spy)
    model = _model(("Relu", "Neg", "Relu"))
    with caplog.at_level(logging.INFO, logger="epctx"):
        so = epctx.SessionOptions()
        so.add_session_config_entry("epctx.partition.cost_rule", "0")
        sess = epctx.InferenceSession(
            model.SerializeToString(), so, providers=[(EP, {"disabled_ops": "Neg"})]
        )
    assert [ep for ep, _ in sess.get_partitions()] == [EP, "CPUExecutionProvider", EP]
    assert calls == [2]
    workers = [c for c in started if "epctx.providers.iree.worker" in c]
    assert len(workers) == 2  # the capability check's compiles of both partitions, nothing else
    done = [r.getMessage() for r in caplog.records if r.getMessage().startswith("compiled partition")]
    assert [m.split()[2] for m in done] == ["1/2", "2/2"]
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(sess.run(None, {"v0": x})[0], run_ort(model, {"v0": x})[0], rtol=1e-6)
