"""A partition its EP fails to compile (``EPFail`` from ``compile``) goes to the next EP, the EP's message as the
reason, warned: OpenVINO's query claims nodes its CPU plugin then fails to compile (onnx-asr's NeMo front ends:
"CPU plug-in doesn't support Parameter operation with dynamic rank"), which failed the session. The EP's other
partitions stay its own; compiled one by one to tell which failed."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import pytest
from onnx import TensorProto, helper

import epctx
from epctx.ep._compiling import CompileContext
from epctx.ep._contract import CompiledPartition, Partition
from epctx.errors import EPFail
from tests.fusing_ep import make_fusing_ep, registered
from tests.oracle import run_ort


def _model() -> bytes:
    """x -> Relu -> Neg -> Abs -> Tanh -> Sigmoid -> y (Abs never claimed: two partitions around it)."""
    ops = ["Relu", "Neg", "Abs", "Tanh", "Sigmoid"]
    nodes = [helper.make_node(op, [f"t{k}"], [f"t{k + 1}"], name=op.lower()) for k, op in enumerate(ops)]
    nodes[0].input[0], nodes[-1].output[0] = "x", "y"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _failing_ep(fails_on: str, claims_all: bool = False) -> type:
    base = make_fusing_ep(
        lambda node: claims_all or node.op_type != "Abs", "CompileFailureTestExecutionProvider"
    )

    class Failing(base):  # type: ignore[misc, valid-type]
        def compile(self, partitions: Sequence[Partition], ctx: CompileContext) -> list[CompiledPartition]:
            if any(n.name == fails_on for p in partitions for n in p.nodes):
                raise EPFail(f"{self.name}: cannot compile a partition holding {fails_on}\nmore detail")
            return super().compile(partitions, ctx)

    return Failing


def _session(ep: type, cpu: bool = True, **config: str) -> epctx.InferenceSession:
    so = epctx.SessionOptions()
    so.add_session_config_entry("epctx.partition.measured_rule", "0")
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    with registered(ep):
        return epctx.InferenceSession(
            _model(), so, providers=[ep.name, *(["CPUExecutionProvider"] if cpu else [])]
        )


def test_a_partition_its_ep_fails_to_compile_runs_on_the_next_ep(caplog: pytest.LogCaptureFixture) -> None:
    ep = _failing_ep("tanh")
    with caplog.at_level(logging.WARNING, logger="epctx"):
        sess = _session(ep)
    placed = {node: provider for provider, nodes in sess.get_partitions() for node in nodes}
    assert placed == {"relu": ep.name, "neg": ep.name, "abs": "CPUExecutionProvider",
                      "tanh": "CPUExecutionProvider", "sigmoid": "CPUExecutionProvider"}  # fmt: skip
    reasons = sess.get_fallback_reasons()
    assert (
        reasons["tanh"][ep.name]
        == f"failed to compile its partition: {ep.name}: cannot compile a partition holding tanh"
    )
    assert "failed to compile its partition" in caplog.text and "they go to the next EP" in caplog.text
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], run_ort(_model(), {"x": x})[0], rtol=1e-6)


def test_without_cpu_fallback_the_nodes_have_nowhere_to_go() -> None:
    with pytest.raises(epctx.errors.EPCtxError, match="cannot compile a partition holding tanh"):
        _session(_failing_ep("tanh", claims_all=True), cpu=False, **{"session.disable_cpu_ep_fallback": "1"})
