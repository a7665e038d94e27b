"""The measured rule (``epctx.partition.measured_rule=1``, ``epctx.partition.measured``): a compiled partition
slower than the kernel EP on the same nodes is handed back, with the measured times as the reason in
``get_fallback_reasons`` / ``get_node_placement``; on by default ("0" turns it off); a partition whose inputs
have dynamic dimensions is measured at the sizes ``epctx.partition.synthetic`` chooses (or the free-dimension
overrides), the verdict needs the median and the best run to agree. A test EP stands for a slow backend here (its compiled partitions wait 20 ms per call
before running the nodes with CPU kernels); tests/providers/test_iree_measured_rule.py runs IREE itself."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from epctx.config import SessionConfig
from epctx.ep._compiling import CompileContext
from epctx.ep._contract import CompiledPartition, Partition
from epctx.errors import InvalidArgument
from epctx.partition.measured import MARGIN, STRONG_MARGIN, Measurement, measure
from epctx.partition.synthetic import (
    LEADING_DIM,
    OTHER_DIM,
    SMALL_DIM,
    chosen_sizes,
    describe_sizes,
    size_choices,
    synthetic_inputs,
)
from tests.fusing_ep import FusingEP, make_fusing_ep, registered
from tests.oracle import run_ort

# the kernel EP's side 2 ms slower: a test EP that runs the same kernels is "not slower" whatever the load
pytestmark = pytest.mark.usefixtures("kernel_ep_delayed")

RULE = "epctx.partition.measured_rule"


def _model(batch: int | str = 2, seq: int | str | None = None) -> bytes:
    """x -> MatMul -> Relu -> Neg -> y; x is [batch, 4], or [batch, seq, 4] when ``seq`` is given."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="matmul"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("Neg", ["b"], ["y"], name="neg"),
    ]
    dims = [batch, 4] if seq is None else [batch, seq, 4]
    graph = helper.make_graph(
        nodes,
        "measured",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _slow_ep(from_size: int = 0, fail_from: int = 0) -> type[FusingEP]:
    """An EP whose compiled partitions wait 20 ms per call when their first input has ``from_size`` elements
    or more (0: always), and raise when it has ``fail_from`` or more (0: never)."""
    base = make_fusing_ep(lambda node: True, "MeasuredRuleTestExecutionProvider")

    class Slow(base):  # type: ignore[misc, valid-type]
        def compile(self, partitions: Sequence[Partition], ctx: CompileContext) -> list[CompiledPartition]:
            def slow(run: CompiledPartition) -> CompiledPartition:
                def call(*inputs: np.ndarray) -> list[np.ndarray]:
                    if fail_from and inputs[0].size >= fail_from:
                        raise ValueError("too large for this test EP")
                    if inputs[0].size >= from_size:
                        time.sleep(0.02)
                    return list(run(*inputs))

                return call

            return [slow(run) for run in super().compile(partitions, ctx)]

    return Slow


def _session(model: bytes, from_size: int = 0, fail_from: int = 0, **config: str) -> epctx.InferenceSession:
    ep = _slow_ep(from_size, fail_from)
    so = epctx.SessionOptions()
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    with registered(ep):
        return epctx.InferenceSession(model, so, providers=[ep.name, "CPUExecutionProvider"])


def _check(sess: epctx.InferenceSession, model: bytes) -> None:
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], run_ort(model, {"x": x})[0], rtol=1e-6)


def test_a_slower_partition_is_handed_back_with_the_times() -> None:
    sess = _session(_model(), **{RULE: "1"})
    assert sess.get_partitions() == [("CPUExecutionProvider", [n]) for n in ("matmul", "relu", "neg")]
    reasons = sess.get_fallback_reasons()
    assert set(reasons) == {"matmul", "relu", "neg"}
    why = reasons["matmul"]["MeasuredRuleTestExecutionProvider"]
    assert (
        why.startswith("measured: MeasuredRuleTestExecutionProvider ") and " vs CPUExecutionProvider " in why
    )
    placed = sess.get_node_placement()
    assert [p.provider for p in placed] == ["CPUExecutionProvider"] * 3
    assert placed[0].declined == (("MeasuredRuleTestExecutionProvider", why),)
    _check(sess, _model())


@pytest.mark.measured_rule_default
def test_on_by_default_and_off_with_zero() -> None:
    """The shipped default hands the slow partition back; "0" keeps it with the EP."""
    assert SessionConfig.of(None).partition_measured_rule is True
    sess = _session(_model())
    assert sess.get_partitions() == [("CPUExecutionProvider", [n]) for n in ("matmul", "relu", "neg")]
    assert set(sess.get_fallback_reasons()) == {"matmul", "relu", "neg"}
    _check(sess, _model())
    off = _session(_model(), **{RULE: "0"})
    assert off.get_partitions() == [("MeasuredRuleTestExecutionProvider", ["matmul", "relu", "neg"])]
    assert off.get_fallback_reasons() == {}
    _check(off, _model())


def test_the_test_suite_runs_with_the_rule_off() -> None:
    """tests/conftest.py: a test not marked ``measured_rule_default`` sees the rule off unless it sets the key."""
    assert SessionConfig.of(None).partition_measured_rule is False
    sess = _session(_model())
    assert sess.get_partitions() == [("MeasuredRuleTestExecutionProvider", ["matmul", "relu", "neg"])]


def test_a_partition_with_dynamic_inputs_is_measured_at_the_chosen_sizes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dynamic batch is measured at 1 (``LEADING_DIM``), and the reason says so."""
    shapes = _spy_shapes(monkeypatch)
    model = _model("batch")
    sess = _session(model, **{RULE: "1"})
    assert sess.get_partitions() == [("CPUExecutionProvider", [n]) for n in ("matmul", "relu", "neg")]
    assert shapes == [[(1, 4)]]
    why = sess.get_fallback_reasons()["matmul"]["MeasuredRuleTestExecutionProvider"]
    assert "synthetic inputs, batch=1;" in why, why
    _check(sess, model)


def test_a_dynamic_dimension_is_measured_at_two_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slower at 128 and at 32: handed back, the reason names both; slower at 128 only: kept (which EP is faster
    depends on the size, and the user's is not known). The second EP has the first's name and code: the cache of
    verdicts (tests/test_partition_measured_cache.py) is off, so that it is measured too."""
    monkeypatch.setenv("EPCTX_MEASURED_CACHE", "0")
    shapes = _spy_shapes(monkeypatch)
    model = _model("batch", "seq")
    sess = _session(model, **{RULE: "1"})
    assert shapes == [[(1, OTHER_DIM, 4)], [(1, SMALL_DIM, 4)]]
    assert {ep for ep, _ in sess.get_partitions()} == {"CPUExecutionProvider"}
    why = sess.get_fallback_reasons()["matmul"]["MeasuredRuleTestExecutionProvider"]
    assert "batch=1, seq=128;" in why and "batch=1, seq=32;" in why, why
    shapes.clear()
    kept = _session(model, from_size=OTHER_DIM * 4, **{RULE: "1"})  # slow at 128, fast at 32
    assert shapes == [[(1, OTHER_DIM, 4)], [(1, SMALL_DIM, 4)]]
    assert kept.get_partitions() == [("MeasuredRuleTestExecutionProvider", ["matmul", "relu", "neg"])]
    assert kept.get_fallback_reasons() == {}
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(kept.run(None, {"x": x})[0], run_ort(model, {"x": x})[0], rtol=1e-6)


def test_a_size_a_side_cannot_run_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The EP raises at 128 (as ppocr_cls's MaxPool does on IREE at 32 pixels): judged at 32 alone."""
    shapes = _spy_shapes(monkeypatch)
    sess = _session(_model("batch", "seq"), fail_from=OTHER_DIM * 4, **{RULE: "1"})
    assert shapes == [[(1, OTHER_DIM, 4)], [(1, SMALL_DIM, 4)]]
    why = sess.get_fallback_reasons()["matmul"]["MeasuredRuleTestExecutionProvider"]
    assert "batch=1, seq=32;" in why and "seq=128" not in why, why


def test_the_measurement_runs_inside_the_eps_run_scopes() -> None:
    """As a session's run: each EP's ``run_scope`` (the CPU EP's BLAS threads per ``intra_op_num_threads``) holds
    while the rule times the partition."""
    import contextlib

    base = _slow_ep()
    seen: list[bool] = []

    class Scoped(base):  # type: ignore[misc, valid-type]
        inside = False

        def run_scope(self) -> Any:
            @contextlib.contextmanager
            def scope() -> Any:
                type(self).inside = True
                try:
                    yield
                finally:
                    type(self).inside = False

            return scope()

        def compile(self, partitions: Sequence[Partition], ctx: CompileContext) -> list[CompiledPartition]:
            def seeing(run: CompiledPartition) -> CompiledPartition:
                return lambda *inputs: (seen.append(type(self).inside), run(*inputs))[1]

            return [seeing(run) for run in super().compile(partitions, ctx)]

    so = epctx.SessionOptions()
    so.add_session_config_entry(RULE, "1")
    with registered(Scoped):
        sess = epctx.InferenceSession(_model(), so, providers=[Scoped.name, "CPUExecutionProvider"])
    assert seen and all(seen), seen
    assert {ep for ep, _ in sess.get_partitions()} == {"CPUExecutionProvider"}


def shifting_ep() -> type[FusingEP]:
    """The slow test EP (``_slow_ep``) claiming {matmul, relu} while matmul is offered, else {neg}."""
    base = _slow_ep()

    class Shifting(base):  # type: ignore[misc, valid-type]
        def get_capability(self, graph: Any, opset_imports: Any, ctx: Any) -> Any:
            from epctx.ep import Capability

            taken = {n.name for n in ctx.assigned}
            wanted = {"matmul", "relu"} if "matmul" not in taken else {"neg"}
            return Capability(tuple(n for n in graph if n.name in wanted and n.name not in taken))

    return Shifting


def test_nodes_an_ep_claims_only_after_a_hand_back_are_left_to_the_next_ep() -> None:
    """An EP whose claim depends on what it is offered (as IREE's capability check does): {matmul, relu} while
    matmul is offered, else {neg}. The rule hands {matmul, relu} back; the EP then claims neg, which it did not
    hold when measured: refused to it too (a partition formed then would run unmeasured: nudenet on IREE ran
    6.8x slower that way)."""
    Shifting = shifting_ep()
    so = epctx.SessionOptions()
    so.add_session_config_entry(RULE, "1")
    with registered(Shifting):
        sess = epctx.InferenceSession(_model(), so, providers=[Shifting.name, "CPUExecutionProvider"])
    assert [len(p.nodes) for p in Shifting.compiled] == [2]  # neg is never compiled
    assert sess.get_partitions() == [("CPUExecutionProvider", [n]) for n in ("matmul", "relu", "neg")]
    reasons = {name: why[Shifting.name] for name, why in sess.get_fallback_reasons().items()}
    assert reasons["matmul"].startswith("measured: ") and reasons["relu"] == reasons["matmul"]
    assert reasons["neg"].startswith("measured rule: ") and "only after" in reasons["neg"], reasons
    _check(sess, _model())


def test_nodes_an_ep_declined_are_not_offered_to_it_again_after_a_hand_back() -> None:
    """A node the EP declined when its partitions were measured is refused to it at once when the graph is
    partitioned again after a hand-back, in the EP's own words: asked again, IREE would compile to check it again
    (silero-vad's folded graph on IREE: 26 s more after its 30 s capability budget was spent)."""
    base = _slow_ep()
    offered: list[set[str]] = []

    class Declining(base):  # type: ignore[misc, valid-type]
        def get_capability(self, graph: Any, opset_imports: Any, ctx: Any) -> Any:
            from epctx.ep import Capability

            taken = {n.name for n in ctx.assigned}
            offered.append({n.name for n in graph} - taken)
            claimed = tuple(n for n in graph if n.name in {"matmul", "relu"} and n.name not in taken)
            declined = {n: "not for this test EP" for n in graph if n.name == "neg" and n.name not in taken}
            return Capability(claimed, declined=declined)

    so = epctx.SessionOptions()
    so.add_session_config_entry(RULE, "1")
    with registered(Declining):
        sess = epctx.InferenceSession(_model(), so, providers=[Declining.name, "CPUExecutionProvider"])
    assert offered[0] == {"matmul", "relu", "neg"}
    assert all("neg" not in names for names in offered[1:]), offered
    assert {ep for ep, _ in sess.get_partitions()} == {"CPUExecutionProvider"}
    reasons = {name: why[Declining.name] for name, why in sess.get_fallback_reasons().items()}
    assert reasons["matmul"].startswith("measured: ")
    assert reasons["neg"] == "not for this test EP", reasons
    _check(sess, _model())
    offered.clear()  # the next session: neg is offered again (only the measured refusals are kept)
    with registered(Declining):
        epctx.InferenceSession(_model(), so, providers=[Declining.name, "CPUExecutionProvider"])
    assert offered and "neg" in offered[0], offered


def test_an_ep_that_keeps_claiming_new_nodes_gets_none_of_them() -> None:
    """An EP that claims one more node at each capability request (r0, then r1, r2, ...): after r0 is handed back,
    two passes refuse what it newly claims, and the last refuses every node it did not hold when measured, so
    that nothing runs on it unmeasured."""
    names = [f"r{k}" for k in range(6)]
    ops = ["Relu", "Neg", "Tanh", "Sigmoid", "Abs", "Neg"]
    nodes = [
        helper.make_node(op, [f"t{k}"], [f"t{k + 1}"], name=name)
        for k, (op, name) in enumerate(zip(ops, names))
    ]
    nodes[0].input[0], nodes[-1].output[0] = "x", "y"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    base = _slow_ep()
    asked: list[int] = []

    class Greedy(base):  # type: ignore[misc, valid-type]
        def get_capability(self, graph: Any, opset_imports: Any, ctx: Any) -> Any:
            from epctx.ep import Capability

            taken = {n.name for n in ctx.assigned}
            wanted = names[len(asked)] if len(asked) < len(names) else ""
            asked.append(1)
            return Capability(tuple(n for n in graph if n.name == wanted and n.name not in taken))

    so = epctx.SessionOptions()
    so.add_session_config_entry(RULE, "1")
    with registered(Greedy):
        sess = epctx.InferenceSession(model, so, providers=[Greedy.name, "CPUExecutionProvider"])
    assert [[n.name for n in p.nodes] for p in Greedy.compiled] == [["r0"]]
    assert {ep for ep, _ in sess.get_partitions()} == {"CPUExecutionProvider"}
    reasons = {name: why[Greedy.name] for name, why in sess.get_fallback_reasons().items()}
    assert reasons["r0"].startswith("measured: ")
    assert all(reasons[n].startswith("measured rule: ") for n in names[1:]), reasons
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], run_ort(model, {"x": x})[0], rtol=1e-6)


def test_free_dimension_overrides_are_the_sizes_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    shapes = _spy_shapes(monkeypatch)
    ep = _slow_ep()
    so = epctx.SessionOptions()
    so.add_session_config_entry(RULE, "1")
    so.add_free_dimension_override_by_name("batch", 3)
    with registered(ep):
        sess = epctx.InferenceSession(_model("batch"), so, providers=[ep.name, "CPUExecutionProvider"])
    assert shapes == [[(3, 4)]]
    why = sess.get_fallback_reasons()["matmul"]["MeasuredRuleTestExecutionProvider"]
    assert "synthetic inputs, static shapes;" in why, why


def _spy_shapes(monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[int, ...]]]:
    """The shapes of the inputs each measurement got."""
    import epctx.partition.measured as measured

    seen: list[list[tuple[int, ...]]] = []
    real = measured.measure

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append([a.shape for a in args[4]])
        return real(*args, **kwargs)

    monkeypatch.setattr(measured, "measure", spy)
    return seen


def test_the_key_takes_a_flag() -> None:
    so = epctx.SessionOptions()
    with pytest.raises(InvalidArgument, match="measured_rule"):
        so.add_session_config_entry(RULE, "sometimes")


def test_the_verdict_needs_the_median_and_the_best_run() -> None:
    assert Measurement("A", 1.0 * MARGIN + 0.01, "B", 1.0, 5).slower  # no best runs: the medians stand
    assert not Measurement("A", 1.0 * MARGIN - 0.01, "B", 1.0, 5).slower
    both = Measurement("A", 3.0, "B", 1.0, 5, best_ms=2.5, fallback_best_ms=0.9)
    assert both.slower and not both.ambiguous and both.verdict() == "handed back"
    loaded = Measurement("A", 3.0, "B", 1.0, 5, best_ms=0.5, fallback_best_ms=0.9)  # a busy core hit A's runs
    assert not loaded.slower and loaded.ambiguous and loaded.verdict().startswith("kept (ambiguous")
    best_only = Measurement("A", 1.0, "B", 1.0, 5, best_ms=0.9, fallback_best_ms=0.5)
    assert not best_only.slower and best_only.ambiguous
    faster = Measurement("A", 0.5, "B", 1.0, 5, best_ms=0.4, fallback_best_ms=0.9)
    assert not faster.slower and not faster.ambiguous and faster.verdict() == "kept"
    assert "best 2.5 vs 0.9 ms" in both.reason() and "in the best run and in the median or" in both.reason()
    # the kernel EP's runs preempted (its median near the EP's), its best run and CPU time not: handed back
    preempted = Measurement("A", 15.6, "B", 14.4, 10, 12.4, 6.21, cpu_ms=12.0, fallback_cpu_ms=6.0)
    assert preempted.slower and "CPU time 12 vs 6 ms" in preempted.reason()
    cpu_only = Measurement("A", 1.0, "B", 1.0, 10, 0.9, 0.9, cpu_ms=3.0, fallback_cpu_ms=1.0)
    assert not cpu_only.slower and cpu_only.ambiguous


def test_a_usual_run_far_slower_than_its_best_is_handed_back() -> None:
    """The median and the CPU time both slower by more than STRONG_MARGIN hand a partition back though its best
    run matches (IREE's task workers at two threads, measured on ddddocr's CNN); either alone does not, nor do
    both under it."""
    erratic = Measurement("A", 7.91, "B", 3.66, 10, 3.49, 3.48, cpu_ms=14.5, fallback_cpu_ms=3.94)
    assert erratic.slower and erratic.verdict() == "handed back"
    assert f"or by more than {STRONG_MARGIN:g}x in the median and the CPU time" in erratic.reason()
    under = STRONG_MARGIN - 0.05
    mild = Measurement(
        "A", 3.66 * under, "B", 3.66, 10, 3.49, 3.48, cpu_ms=3.94 * under, fallback_cpu_ms=3.94
    )
    assert not mild.slower and mild.ambiguous
    median_only = Measurement("A", 7.91, "B", 3.66, 10, 3.49, 3.48, cpu_ms=4.0, fallback_cpu_ms=3.94)
    assert not median_only.slower  # a busy core held up the EP's runs: its CPU time says it is not slower
    no_cpu = Measurement("A", 7.91, "B", 3.66, 10, 3.49, 3.48)
    assert not no_cpu.slower
    # a side that waits (a sleep, a device): its CPU time is noise, not its work
    waiting = Measurement("A", 40.1, "B", 20.1, 10, 1.09, 20.1, cpu_ms=0.065, fallback_cpu_ms=0.042)
    assert not waiting.slower and waiting.ambiguous


def test_preempted_runs_do_not_hand_back_a_faster_partition() -> None:
    """The EP's side is fast (1 ms) but most of its runs are held up (40 ms, as when another process holds the
    core): its median is slower, its best run is not; the measurement is ambiguous and the EP keeps it."""
    calls = iter(range(1000))

    def preempted(*inputs: np.ndarray) -> list[np.ndarray]:
        time.sleep(0.001 if next(calls) % 3 == 0 else 0.04)
        return list(inputs)

    def steady(*inputs: np.ndarray) -> list[np.ndarray]:
        time.sleep(0.02)
        return list(inputs)

    found = measure("A", preempted, "B", steady, [np.zeros(2, np.float32)])
    assert found is not None and found.runs >= 3
    assert found.ms > found.fallback_ms * MARGIN and found.best_ms < found.fallback_best_ms
    assert not found.slower and found.ambiguous


def _value(name: str, dims: list[int | str | None], dtype: Any) -> Any:
    import onnx_ir as ir

    return ir.Value(name=name, shape=ir.Shape(dims), type=ir.TensorType(dtype))


def test_synthetic_inputs_sizes_and_values() -> None:
    import onnx_ir as ir

    x = _value("x", [2, 3], ir.DataType.FLOAT)
    ids = _value("ids", [5], ir.DataType.INT64)
    mask = _value("attention_mask", [5], ir.DataType.INT64)
    keep = _value("key_padding_mask", [5], ir.DataType.BOOL)
    arrays = synthetic_inputs([x, ids, mask, keep])
    assert arrays is not None
    assert [(a.shape, a.dtype) for a in arrays] == [((2, 3), np.float32), ((5,), np.int64), ((5,), np.int64),
                                                    ((5,), np.bool_)]  # fmt: skip
    assert float(arrays[0].min()) >= 0.0 and not arrays[1].any()
    assert arrays[2].tolist() == [1] * 5 and arrays[3].all()  # masks: nothing masked out


def test_dynamic_dimensions_get_the_documented_sizes() -> None:
    import onnx_ir as ir

    ids = _value("input_ids", ["batch", "sequence"], ir.DataType.INT64)
    mask = _value("attention_mask", ["batch", "sequence"], ir.DataType.INT64)
    image = _value("x", [-1, 3, "?", None], ir.DataType.FLOAT)
    past = _value("past", [1, 2, "past", 16], ir.DataType.FLOAT)
    n = _value("y", [4, "N"], ir.DataType.FLOAT)
    sizes = chosen_sizes([ids, mask, image, past, n])
    assert sizes == {"batch": LEADING_DIM, "sequence": OTHER_DIM, "x[0]": 1, "x[2]": OTHER_DIM,
                     "x[3]": OTHER_DIM, "past": OTHER_DIM, "N": 1}  # fmt: skip
    arrays = synthetic_inputs([ids, mask, image, past, n])
    assert arrays is not None
    assert [a.shape for a in arrays] == [(1, 128), (1, 128), (1, 3, 128, 128), (1, 2, 128, 16), (4, 1)]
    assert describe_sizes({"batch": 1, "sequence": 128}) == "batch=1, sequence=128"
    assert size_choices([ids]) == [{"batch": 1, "sequence": OTHER_DIM}, {"batch": 1, "sequence": SMALL_DIM}]
    assert size_choices([_value("b", ["batch", 3], ir.DataType.FLOAT)]) == [{"batch": 1}]  # a batch only: one
    assert chosen_sizes([ir.Value(name="u", type=ir.TensorType(ir.DataType.FLOAT))]) is None  # rank unknown


def test_a_dimension_named_by_an_expression_is_computed_from_its_names() -> None:
    """As shape inference names a feature map of a dynamic image (nudenet): evaluated at the names' sizes, so
    the three scales a Concat joins agree."""
    import onnx_ir as ir

    stride8 = "(floor(floor(floor(height/2 - 1/2)/2)/2) + 1)*(floor(floor(floor(width/2 - 1/2)/2)/2) + 1)"
    image = _value("images", ["batch", 3, "height", "width"], ir.DataType.FLOAT)
    boxes = _value("boxes", ["batch", 64, stride8], ir.DataType.FLOAT)
    scaled = _value("scaled", ["2*batch", "height + 1", "bad(height)"], ir.DataType.FLOAT)
    large, small = size_choices([image, boxes, scaled]) or [{}, {}]
    assert large[stride8] == 16 * 16 and small[stride8] == 4 * 4  # 128 -> 16 after three stride-2 steps
    assert large["height"] == OTHER_DIM and small["height"] == SMALL_DIM
    assert large["2*batch"] == 2 and large["height + 1"] == OTHER_DIM + 1
    assert large["bad(height)"] == OTHER_DIM  # not an expression it knows: sized as a plain name


@pytest.mark.measured_rule_default
@pytest.mark.parametrize("asked", [None, "1"])
def test_model_compiler_measures_only_when_asked(
    tmp_path: Any, asked: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiled model is the same wherever it is compiled (package targets, the compile farm's nodes): the
    rule is off for ``ModelCompiler`` unless the key asks for it."""
    from epctx.partition import measured

    calls: list[object] = []
    real = measured.hand_back

    def spy(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(measured, "hand_back", spy)
    so = epctx.SessionOptions()
    so.add_provider("ExampleExecutionProvider", {})
    if asked is not None:
        so.add_session_config_entry(RULE, asked)
    epctx.ModelCompiler(so, _model()).compile_to_file(str(tmp_path / "m_ctx.onnx"))
    assert bool(calls) == (asked == "1")
    assert (tmp_path / "m_ctx.onnx").is_file()


def test_a_partition_the_kernel_ep_cannot_run_is_kept_unmeasured(caplog: pytest.LogCaptureFixture) -> None:
    """A compiled partition holding a node the kernel EP has no kernel for (OpenVINO takes onnxruntime's
    com.microsoft DynamicQuantizeLSTM, which the CPU EP lacks) cannot be timed against it: kept, said so, where
    building the CPU side raised and failed the session."""
    import logging

    graph = helper.make_graph(
        [helper.make_node("Twice", ["x"], ["y"], name="twice", domain="test.custom")],
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("test.custom", 1)]
    model = helper.make_model(graph, opset_imports=opsets).SerializeToString()
    base = make_fusing_ep(lambda node: True, "CustomOpTestExecutionProvider")

    class Custom(base):  # type: ignore[misc, valid-type]
        def compile(self, partitions: Sequence[Partition], ctx: CompileContext) -> list[CompiledPartition]:
            return [lambda x: [x * 2] for _ in partitions]

    so = epctx.SessionOptions()
    so.add_session_config_entry(RULE, "1")
    caplog.set_level(logging.INFO, logger="epctx")
    with registered(Custom):
        sess = epctx.InferenceSession(model, so, providers=[Custom.name, "CPUExecutionProvider"])
    assert sess.get_partitions() == [(Custom.name, ["twice"])]
    assert "not measured: CPUExecutionProvider cannot run it" in caplog.text
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x * 2)
