"""The measured rule's hand-backs recorded in the context model (metadata ``epctx.measured_refusals``): a session
over that context refuses those nodes to that EP again, so a warm load compiles nothing and measures nothing;
the reason shows prefixed ``from the context model:``. Also through the transparent cache and
``epctx.context_reuse``. A slow test EP stands for a slow backend: the Example EP (whose partitions are saved
in and loaded from the context) with its partition holding ``matmul`` waiting 20 ms per call when compiled
(loaded from a context, it runs at its normal speed)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
import epctx.partition.measured as measured
from epctx.ep import Capability, CapabilityContext, CompileContext, CompiledPartition, Partition
from epctx.partition.measured import FROM_CONTEXT, REFUSALS_KEY
from epctx.providers.example.interpreter import CompiledProgram
from epctx.providers.example.provider import ExampleExecutionProvider
from epctx.testing import no_compile
from tests.fusing_ep import registered
from tests.oracle import run_ort

# the kernel EP's side 2 ms slower: a test EP that runs the same kernels is "not slower" whatever the load
pytestmark = pytest.mark.usefixtures("kernel_ep_delayed")

RULE = "epctx.partition.measured_rule"
SLOW = "SlowExampleExecutionProvider"
CPU = "CPUExecutionProvider"


class _SlowProgram(CompiledProgram):
    __slots__ = ()

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        time.sleep(0.02)
        return super().__call__(*inputs)


class SlowExample(ExampleExecutionProvider):
    """The Example EP, its compiled partitions holding a node named in ``slow`` 20 ms slower per call."""

    name = SLOW
    slow: frozenset[str] = frozenset({"matmul"})
    compiles_counted: list[int] = []
    asked: list[set[str]] = []  # per capability request, the names of the nodes shown as taken

    def get_capability(self, graph: Any, opset_imports: Any, ctx: CapabilityContext) -> Capability:
        type(self).asked.append({n.name or "" for n in ctx.assigned})
        return super().get_capability(graph, opset_imports, ctx)

    def compile(self, partitions: Sequence[Partition], ctx: CompileContext) -> list[CompiledPartition]:
        type(self).compiles_counted.append(len(partitions))
        out = super().compile(partitions, ctx)
        return [
            _SlowProgram(run.program, run.weights) if any(n.name in self.slow for n in part.nodes) else run  # type: ignore[attr-defined]
            for part, run in zip(partitions, out)
        ]


def _model(middle: str = "Neg") -> onnx.ModelProto:
    """x -> [matmul -> relu] -> neg -> [matmul2 -> tanh] -> y; the Example EP takes the bracketed pairs (not Neg):
    two partitions, the first slow. ``middle="Sigmoid"``: the EP takes all five nodes, one partition."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="matmul"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node(middle, ["b"], ["c"], name="neg"),
        helper.make_node("MatMul", ["c", "w2"], ["d"], name="matmul2"),
        helper.make_node("Tanh", ["d"], ["y"], name="tanh"),
    ]
    graph = helper.make_graph(
        nodes,
        "measured_ctx",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [w, w2],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx"
    onnx.save(_model(), path)
    return path


def _session(model: str | Path, **config: str) -> epctx.InferenceSession:
    so = epctx.SessionOptions()
    so.add_session_config_entry("epctx.partition.cost_rule", "0")  # two tiny partitions stay the EP's
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    with registered(SlowExample):
        return epctx.InferenceSession(str(model), so, providers=[SLOW, CPU])


def _check(sess: epctx.InferenceSession) -> None:
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(
        sess.run(None, {"x": x})[0], run_ort(_model(), {"x": x})[0], rtol=1e-5, atol=1e-6
    )


def _generate(source: Path, ctx: Path) -> epctx.InferenceSession:
    sess = _session(source, **{RULE: "1", "ep.context_enable": "1", "ep.context_file_path": str(ctx)})
    assert sess.get_partitions() == [
        (CPU, ["matmul"]),
        (CPU, ["relu"]),
        (CPU, ["neg"]),
        (SLOW, ["matmul2", "tanh"]),
    ]
    return sess


def _metadata(path: Path) -> dict[str, str]:
    return {p.key: p.value for p in onnx.load(path).metadata_props}


@pytest.fixture
def no_measuring(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """A spy on the measurement: every call recorded (a warm load must make none)."""
    calls: list[Any] = []
    real = measured.measure

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(measured, "measure", spy)
    return calls


def test_the_context_records_the_hand_back(source: Path, tmp_path: Path) -> None:
    ctx = tmp_path / "model_ctx.onnx"
    cold = _generate(source, ctx)
    reason = cold.get_fallback_reasons()["matmul"][SLOW]
    assert reason.startswith(f"measured: {SLOW} ")
    record = json.loads(_metadata(ctx)[REFUSALS_KEY])
    assert record == {SLOW: {"matmul": reason, "relu": reason}}
    onnx.checker.check_model(onnx.load(ctx), full_check=True)
    _check(cold)


@pytest.mark.measured_rule_default
def test_the_default_records_the_hand_back(source: Path, tmp_path: Path) -> None:
    """The rule on by default: a context generated without the key records the hand-back too."""
    ctx = tmp_path / "model_ctx.onnx"
    cold = _session(source, **{"ep.context_enable": "1", "ep.context_file_path": str(ctx)})
    assert cold.get_partitions()[0] == (CPU, ["matmul"])
    assert set(json.loads(_metadata(ctx)[REFUSALS_KEY])[SLOW]) == {"matmul", "relu"}
    with no_compile():
        warm = _session(ctx)
    assert warm.get_partitions()[:3] == [(CPU, ["matmul"]), (CPU, ["relu"]), (CPU, ["neg"])]
    _check(warm)


def test_a_warm_load_compiles_and_measures_nothing(
    source: Path, tmp_path: Path, no_measuring: list[Any]
) -> None:
    ctx = tmp_path / "model_ctx.onnx"
    reason = _generate(source, ctx).get_fallback_reasons()["matmul"][SLOW]
    no_measuring.clear()
    SlowExample.compiles_counted.clear()
    for rule in ("1", "0"):  # the record applies whether or not the rule is on
        with no_compile():
            warm = _session(ctx, **{RULE: rule})
        assert no_measuring == [] and SlowExample.compiles_counted == []
        assert SlowExample.asked[-1] >= {"matmul", "relu"}  # shown as taken: neither claimed nor probed
        parts = warm.get_partitions()
        assert parts[:3] == [(CPU, ["matmul"]), (CPU, ["relu"]), (CPU, ["neg"])]
        assert parts[3][0] == SLOW  # the kept partition, loaded from its EPContext node
        assert warm.get_fallback_reasons() == {
            "matmul": {SLOW: FROM_CONTEXT + reason},
            "relu": {SLOW: FROM_CONTEXT + reason},
        }
        placed = {p.name: p for p in warm.get_node_placement()}
        assert placed["matmul"].provider == CPU
        assert placed["matmul"].declined == ((SLOW, FROM_CONTEXT + reason),)
        _check(warm)


def test_a_context_without_the_record_behaves_as_before(source: Path, tmp_path: Path) -> None:
    """The record removed: the EP claims the plain nodes again and compiles them (a warm load over that
    context compiles, as before the record existed)."""
    ctx = tmp_path / "model_ctx.onnx"
    _generate(source, ctx)
    model = onnx.load(ctx)
    kept = [p for p in model.metadata_props if p.key != REFUSALS_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    bare = tmp_path / "bare_ctx.onnx"
    onnx.save(model, bare)
    SlowExample.compiles_counted.clear()
    warm = _session(bare)
    assert SlowExample.compiles_counted == [1]
    assert warm.get_partitions()[0] == (SLOW, ["matmul", "relu"])
    assert warm.get_fallback_reasons() == {}
    _check(warm)


def test_onnxruntime_loads_a_context_with_only_the_record(tmp_path: Path) -> None:
    """Everything handed back: the context model is the plain graph with the record, which onnxruntime loads and
    runs as the source; a warm load over it compiles nothing and does not even ask the EP (every node is
    refused to it: no capability probe, which IREE's would compile)."""
    source = tmp_path / "model.onnx"
    model = _model("Sigmoid")
    onnx.save(model, source)
    ctx = tmp_path / "model_ctx.onnx"
    cold = _session(source, **{RULE: "1", "ep.context_enable": "1", "ep.context_file_path": str(ctx)})
    assert {ep for ep, _ in cold.get_partitions()} == {CPU}
    record = json.loads(_metadata(ctx)[REFUSALS_KEY])
    assert set(record[SLOW]) == {"matmul", "relu", "neg", "matmul2", "tanh"}
    x = np.random.default_rng(2).standard_normal((2, 4)).astype(np.float32)
    expected = run_ort(model, {"x": x})[0]
    got = ort.InferenceSession(str(ctx), providers=[CPU]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    SlowExample.asked.clear()
    with no_compile():
        warm = _session(ctx)
    assert SlowExample.asked == []
    assert {ep for ep, _ in warm.get_partitions()} == {CPU}
    assert set(warm.get_fallback_reasons()) == set(record[SLOW])
    np.testing.assert_allclose(warm.run(None, {"x": x})[0], expected, rtol=1e-5, atol=1e-6)


def test_unknown_names_and_a_bad_record_are_ignored(source: Path, tmp_path: Path) -> None:
    import onnx_ir as ir

    graph = ir.serde.deserialize_model(_model()).graph
    found = measured.recorded_refusals(graph, json.dumps({SLOW: {"matmul": "why", "gone": "why"}}))
    assert [(n.name, v) for n, v in found.items()] == [("matmul", (SLOW, FROM_CONTEXT + "why"))]
    assert measured.recorded_refusals(graph, "not json") == {}
    assert measured.recorded_refusals(graph, "[1, 2]") == {}
    assert measured.recorded_refusals(graph, None) == {}


def _warm_checks(warm: epctx.InferenceSession, calls: list[Any]) -> None:
    assert calls == [] and SlowExample.compiles_counted == []
    assert warm.get_partitions()[:3] == [(CPU, ["matmul"]), (CPU, ["relu"]), (CPU, ["neg"])]
    why = warm.get_fallback_reasons()["matmul"][SLOW]
    assert why.startswith(FROM_CONTEXT + f"measured: {SLOW} ")
    _check(warm)


def test_the_transparent_cache_serves_the_record(
    source: Path, tmp_path: Path, no_measuring: list[Any]
) -> None:
    config = {RULE: "1", "epctx.context_cache": str(tmp_path / "cache")}
    cold = _session(source, **config)
    assert cold.get_partitions()[0] == (CPU, ["matmul"]) and no_measuring == [SLOW, SLOW]
    no_measuring.clear()
    SlowExample.compiles_counted.clear()
    with no_compile():
        warm = _session(source, **config)
    _warm_checks(warm, no_measuring)


def test_context_reuse_serves_the_record(source: Path, tmp_path: Path, no_measuring: list[Any]) -> None:
    ctx = tmp_path / "model_ctx.onnx"
    config = {
        RULE: "1",
        "ep.context_enable": "1",
        "ep.context_file_path": str(ctx),
        "epctx.context_reuse": "1",
    }
    _session(source, **config)
    assert REFUSALS_KEY in _metadata(ctx)
    no_measuring.clear()
    SlowExample.compiles_counted.clear()
    with no_compile():
        warm = _session(source, **config)
    _warm_checks(warm, no_measuring)


def test_model_compiler_writes_the_record(source: Path, tmp_path: Path, no_measuring: list[Any]) -> None:
    """ModelCompiler (onnxruntime's compile API) goes through the same stages: its context records the
    hand-back, and a session over it compiles and measures nothing."""
    so = epctx.SessionOptions()
    so.add_provider(SLOW, {})
    so.add_provider(CPU, {})
    so.add_session_config_entry(RULE, "1")
    so.add_session_config_entry("epctx.partition.cost_rule", "0")
    ctx = tmp_path / "compiled_ctx.onnx"
    with registered(SlowExample):
        epctx.ModelCompiler(so, str(source)).compile_to_file(str(ctx))
    assert set(json.loads(_metadata(ctx)[REFUSALS_KEY])[SLOW]) == {"matmul", "relu"}
    no_measuring.clear()
    SlowExample.compiles_counted.clear()
    with no_compile():
        warm = _session(ctx)
    _warm_checks(warm, no_measuring)
