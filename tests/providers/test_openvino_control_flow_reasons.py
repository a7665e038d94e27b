"""Control flow OpenVINO declines carries OpenVINO's own reason: its ONNX frontend's words about the node inside
the body it could not translate (partial conversion hides those placeholders inside the If / Loop, and the
device's query then only says it does not support the If), or its plugin's words from a probe compile where
the query leaves a control-flow operation out (as the CPU plugin's query does, silently, for an If whose
branches differ in rank). onnxruntime CPU is the oracle for the results."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto

import epctx
from epctx.ep import CapabilityContext
from epctx.model.load import load_model
from epctx.providers.openvino import OpenVINOExecutionProvider
from epctx.providers.openvino.probe import plugin_message

pytest.importorskip("openvino")
ort = pytest.importorskip("onnxruntime")

OV = "OpenVINOExecutionProvider"
GENERIC = "could not translate it (partial conversion)"


def _silero() -> Path:
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the silero_vad wheel is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"


def test_silero_vad_if_declined_with_the_frontends_words_from_its_body() -> None:
    """silero-vad's top-level If (on sr): its bodies hold If nodes whose branches differ in rank ("squeeze the
    last dimension if it is 1"), so the Conv after them has an input of unknown rank, which OpenVINO's Conv
    translator refuses. That is the If's reason, not the query's "does not support If"."""
    session = epctx.InferenceSession(str(_silero()), providers=[OV])
    reasons = {name: why[OV] for name, why in session.get_fallback_reasons().items()}
    why = reasons["If_0"]
    assert why.startswith("OpenVINO's ONNX frontend failed to convert Conv-16: ")
    assert "The input data tensor's rank has to be known (static)" in why
    assert "in its body" in why and "decoder/decoder/2/Conv" in why
    assert "(Core.query_model)" not in why and GENERIC not in why
    on_cpu = [n for ep, nodes in session.get_partitions() if ep != OV for n in nodes]
    assert on_cpu and all(reasons.get(n) for n in on_cpu)  # every node OpenVINO does not run says why
    # silero's streaming use on this session: the state carried over chunks, both rates (both branches)
    oracle = ort.InferenceSession(str(_silero()), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for sr, samples in ((16000, 576), (8000, 288)):  # 512 / 256 new samples behind 64 / 32 of context
        state = expected_state = np.zeros((2, 1, 128), np.float32)
        for _ in range(6):
            chunk = (rng.standard_normal((1, samples)) * 0.3).astype(np.float32)
            rate = np.array(sr, np.int64)
            want, expected_state = oracle.run(None, {"input": chunk, "state": expected_state, "sr": rate})
            got, state = session.run(None, {"input": chunk, "state": state, "sr": rate})
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)
            np.testing.assert_allclose(state, expected_state, atol=1e-5, rtol=1e-4)


def _dynamic_rank_if() -> onnx.ModelProto:
    """x[2, T] -> If(T == 1: Squeeze(x, -1) else x) -> Relu -> z, and Exp(x) beside it: the If's branches
    differ in rank (the pattern of silero-vad's bodies, at the top level)."""
    tensor = oh.make_tensor_value_info
    array = onnx.numpy_helper.from_array
    then = oh.make_graph([oh.make_node("Squeeze", ["x", "axes"], ["s"], name="squeeze")], "then", [], [
        tensor("s", TensorProto.FLOAT, None)
    ])  # fmt: skip
    other = oh.make_graph([oh.make_node("Identity", ["x"], ["i"], name="same")], "else", [], [
        tensor("i", TensorProto.FLOAT, None)
    ])  # fmt: skip
    nodes = [
        oh.make_node("Constant", [], ["axes"], name="axes", value=array(np.array([-1], np.int64))),
        oh.make_node("Shape", ["x"], ["last"], name="shape", start=-1),
        oh.make_node("Constant", [], ["one"], name="one", value=array(np.array([1], np.int64))),
        oh.make_node("Equal", ["last", "one"], ["is_one"], name="equal"),
        oh.make_node("Squeeze", ["is_one"], ["cond"], name="cond"),
        oh.make_node("Exp", ["x"], ["e"], name="exp"),
        oh.make_node("If", ["cond"], ["y"], name="squeeze_if", then_branch=then, else_branch=other),
        oh.make_node("Relu", ["y"], ["z"], name="relu"),
    ]
    outputs = [tensor("z", TensorProto.FLOAT, None), tensor("e", TensorProto.FLOAT, None)]
    graph = oh.make_graph(nodes, "dynamic_rank_if", [tensor("x", TensorProto.FLOAT, [2, "T"])], outputs)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def _capability(proto: onnx.ModelProto, ep: OpenVINOExecutionProvider) -> tuple[list[str], dict[str, str]]:
    model = load_model(proto.SerializeToString(), infer_types=True).model
    capability = ep.get_capability(model.graph, dict(model.opset_imports), CapabilityContext())
    return [n.name or "" for n in capability.claimed], {
        n.name or "": w for n, w in capability.declined.items()
    }


def test_dynamic_rank_if_declined_with_the_plugins_words() -> None:
    """The CPU plugin's query_model leaves out the If (and the Relu reading its output of unknown rank),
    without a word; its compile names the If and says why. The If is declined with those words, the rest
    asked again: Exp is OpenVINO's, Relu keeps the query's reason."""
    claimed, declined = _capability(_dynamic_rank_if(), OpenVINOExecutionProvider())
    assert "exp" in claimed and "squeeze_if" not in claimed
    assert declined["relu"].startswith("OpenVINO's CPU device does not support its operation(s) Relu")
    assert declined["squeeze_if"] == (
        "OpenVINO's CPU plugin refused to compile it: CPU plug-in doesn't support If operation with dynamic "
        "rank (Core.compile_model)"
    )
    data = _dynamic_rank_if().SerializeToString()
    options = epctx.SessionOptions()
    options.add_session_config_entry("epctx.partition.measured_rule", "0")
    session = epctx.InferenceSession(data, options, providers=[OV])
    oracle = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for length in (1, 3):  # both branches: rank 1 and rank 2 out of the If
        feeds = {"x": np.random.default_rng(length).standard_normal((2, length)).astype(np.float32)}
        for got, want in zip(session.run(None, feeds), oracle.run(None, feeds)):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _scan_with_wrap_pad() -> onnx.ModelProto:
    """Scan over the rows of x[N, 4]: acc = Pad_wrap(acc + row)[1:5] (ONNX Scan is OpenVINO's TensorIterator)."""
    tensor = oh.make_tensor_value_info
    array = onnx.numpy_helper.from_array
    body = oh.make_graph(
        [
            oh.make_node("Add", ["acc", "row"], ["sum"], name="scan_add"),
            oh.make_node("Pad", ["sum", "pads"], ["padded"], name="scan_pad", mode="wrap"),
            oh.make_node("Slice", ["padded", "starts", "ends"], ["acc_out"], name="scan_slice"),
            oh.make_node("Identity", ["acc_out"], ["row_out"], name="scan_out"),
        ],
        "scan_body",
        [tensor("acc", TensorProto.FLOAT, [4]), tensor("row", TensorProto.FLOAT, [4])],
        [tensor("acc_out", TensorProto.FLOAT, [4]), tensor("row_out", TensorProto.FLOAT, [4])],
    )
    inits = [
        array(np.array([1, 1], np.int64), "pads"),
        array(np.array([1], np.int64), "starts"),
        array(np.array([5], np.int64), "ends"),
    ]
    nodes = [oh.make_node("Scan", ["init", "x"], ["acc", "rows"], name="scan", body=body, num_scan_inputs=1)]
    inputs = [tensor("init", TensorProto.FLOAT, [4]), tensor("x", TensorProto.FLOAT, ["N", 4])]
    outputs = [tensor("acc", TensorProto.FLOAT, [4]), tensor("rows", TensorProto.FLOAT, ["N", 4])]
    graph = oh.make_graph(nodes, "scan_wrap", inputs, outputs, inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def test_scan_declined_with_the_frontends_words_from_its_body() -> None:
    data = _scan_with_wrap_pad().SerializeToString()
    session = epctx.InferenceSession(data, providers=[OV])
    assert session.get_fallback_reasons()["scan"][OV] == (
        "OpenVINO's ONNX frontend failed to convert Pad-17: Unsupported padding mode: [wrap] "
        "(node 'scan_pad' in its body)"
    )
    feeds = {"init": np.zeros(4, np.float32), "x": np.arange(12, dtype=np.float32).reshape(3, 4)}
    oracle = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for got, want in zip(session.run(None, feeds), oracle.run(None, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


class _CautiousCore:
    """OpenVINO's real core whose query_model leaves out every If (as its query does for control flow it
    cannot judge without compiling); compile_model is the real one."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.compiles = 0

    def query_model(self, model: Any, device: str, config: dict[str, Any]) -> dict[str, str]:
        kinds = {op.get_friendly_name(): op.get_type_name() for op in model.get_ordered_ops()}
        answer = self.core.query_model(model, device, config)
        return {name: dev for name, dev in answer.items() if kinds.get(name) != "If"}

    def compile_model(self, model: Any, device: str, config: dict[str, Any]) -> Any:
        self.compiles += 1
        return self.core.compile_model(model, device, config)


def _static_rank_if() -> onnx.ModelProto:
    tensor = oh.make_tensor_value_info
    then = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["t"])], "then", [], [tensor("t", TensorProto.FLOAT, [2])]
    )
    other = oh.make_graph(
        [oh.make_node("Neg", ["x"], ["e"])], "else", [], [tensor("e", TensorProto.FLOAT, [2])]
    )
    nodes = [oh.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)]
    inputs = [tensor("x", TensorProto.FLOAT, [2]), tensor("c", TensorProto.BOOL, [])]
    graph = oh.make_graph(nodes, "static_if", inputs, [tensor("y", TensorProto.FLOAT, [2])])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def test_probe_compile_claims_control_flow_a_cautious_query_left_out() -> None:
    """Where the query leaves a control-flow operation out but the plugin compiles the candidates, the
    compile is OpenVINO's verdict: the If is claimed (one probe compile); the real query claims it too."""
    ep = OpenVINOExecutionProvider()
    assert _capability(_static_rank_if(), ep)[0] == ["if"]
    cautious = _CautiousCore(ep.core)
    ep.core = cautious
    claimed, declined = _capability(_static_rank_if(), ep)
    assert (claimed, declined, cautious.compiles) == (["if"], {}, 1)


def test_plugin_message_without_locations() -> None:
    text = (
        "Exception from src/inference/src/cpp/core.cpp:117:\n"
        "Exception from src/inference/src/dev/plugin.cpp:54:\n"
        "Check '!shape.rank().is_dynamic()' failed at src/plugins/intel_cpu/src/node.cpp:108:\n"
        "Unexpected: CPU plug-in doesn't support If operation with dynamic rank. Operation name: theif\n\n"
    )
    assert plugin_message(text) == "CPU plug-in doesn't support If operation with dynamic rank"
    assert plugin_message("") == "no message"
