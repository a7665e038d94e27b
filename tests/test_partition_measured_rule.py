"""The measured rule (``epctx.partition.measured_rule=1``, ``epctx.partition.measured``): a compiled partition
slower than the kernel EP on the same nodes is handed back, with the measured times as the reason in
``get_fallback_reasons`` / ``get_node_placement``; off by default; a partition whose input shapes are not
stated is not measured. A test EP stands for a slow backend here (its compiled partitions wait 20 ms per call
before running the nodes with CPU kernels); tests/providers/test_iree_measured_rule.py runs IREE itself."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from epctx.ep._compiling import CompileContext
from epctx.ep._contract import CompiledPartition, Partition
from epctx.errors import InvalidArgument
from epctx.partition.measured import MARGIN, Measurement, synthetic_inputs
from tests.fusing_ep import FusingEP, make_fusing_ep, registered
from tests.oracle import run_ort

RULE = "epctx.partition.measured_rule"


def _model(batch: int | str = 2) -> bytes:
    """x -> MatMul -> Relu -> Neg -> y."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="matmul"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("Neg", ["b"], ["y"], name="neg"),
    ]
    graph = helper.make_graph(
        nodes,
        "measured",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _slow_ep() -> type[FusingEP]:
    base = make_fusing_ep(lambda node: True, "MeasuredRuleTestExecutionProvider")

    class Slow(base):  # type: ignore[misc, valid-type]
        def compile(self, partitions: Sequence[Partition], ctx: CompileContext) -> list[CompiledPartition]:
            def slow(run: CompiledPartition) -> CompiledPartition:
                def call(*inputs: np.ndarray) -> list[np.ndarray]:
                    time.sleep(0.02)
                    return list(run(*inputs))

                return call

            return [slow(run) for run in super().compile(partitions, ctx)]

    return Slow


def _session(model: bytes, **config: str) -> epctx.InferenceSession:
    ep = _slow_ep()
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


def test_off_by_default() -> None:
    sess = _session(_model())
    assert sess.get_partitions() == [("MeasuredRuleTestExecutionProvider", ["matmul", "relu", "neg"])]
    assert sess.get_fallback_reasons() == {}
    _check(sess, _model())


def test_a_partition_with_dynamic_inputs_is_not_measured() -> None:
    model = _model("batch")
    sess = _session(model, **{RULE: "1"})
    assert sess.get_partitions() == [("MeasuredRuleTestExecutionProvider", ["matmul", "relu", "neg"])]
    _check(sess, model)


def test_the_key_takes_a_flag() -> None:
    so = epctx.SessionOptions()
    with pytest.raises(InvalidArgument, match="measured_rule"):
        so.add_session_config_entry(RULE, "sometimes")


def test_margin_and_synthetic_inputs() -> None:
    assert Measurement("A", 1.0 * MARGIN + 0.01, "B", 1.0, 5).slower
    assert not Measurement("A", 1.0 * MARGIN - 0.01, "B", 1.0, 5).slower
    import onnx_ir as ir

    x = ir.Value(name="x", shape=ir.Shape([2, 3]), type=ir.TensorType(ir.DataType.FLOAT))
    ids = ir.Value(name="ids", shape=ir.Shape([5]), type=ir.TensorType(ir.DataType.INT64))
    part = Partition("p", "A", (), (x, ids), (), (), {"": 17})
    arrays = synthetic_inputs(part)
    assert arrays is not None
    assert [(a.shape, a.dtype) for a in arrays] == [((2, 3), np.float32), ((5,), np.int64)]
    assert float(arrays[0].min()) >= 0.0 and not arrays[1].any()
    dynamic = ir.Value(name="d", shape=ir.Shape(["n", 3]), type=ir.TensorType(ir.DataType.FLOAT))
    assert synthetic_inputs(Partition("p", "A", (), (dynamic,), (), (), {"": 17})) is None
