"""Nodes OpenVINO declines carry OpenVINO's own reason (its ONNX frontend's conversion report, the device's
query_model), and still run correctly on the next EP (onnxruntime CPU is the oracle)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto

import epctx
from epctx.ep import CapabilityContext
from epctx.model.load import load_model
from epctx.providers.openvino import OpenVINOExecutionProvider
from epctx.providers.openvino.reasons import node_reasons

pytest.importorskip("openvino")
ort = pytest.importorskip("onnxruntime")

PROVIDERS = ["OpenVINOExecutionProvider", "CPUExecutionProvider"]


def _declining_model() -> bytes:
    """Ops OpenVINO 2026's frontend refuses with a message (Pad mode=wrap, Resize tf_crop_and_resize) or has
    no rule for (StringNormalizer), beside one it takes (Relu)."""
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])
    s = oh.make_tensor_value_info("s", TensorProto.STRING, [3])
    nodes = [
        oh.make_node("Pad", ["x", "pads"], ["padded"], name="pad_wrap", mode="wrap"),
        oh.make_node(
            "Resize",
            ["x", "", "scales"],
            ["resized"],
            name="resize_crop",
            mode="linear",
            coordinate_transformation_mode="tf_crop_and_resize",
        ),
        oh.make_node("Relu", ["x"], ["relu"], name="relu"),
        oh.make_node(
            "StringNormalizer",
            ["s"],
            ["normalized"],
            name="normalizer",
            case_change_action="UPPER",
            locale="C",
        ),
    ]
    outputs = [oh.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("padded", "resized", "relu")]
    outputs.append(oh.make_tensor_value_info("normalized", TensorProto.STRING, None))
    inits = [
        onnx.numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
        onnx.numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
    ]
    graph = oh.make_graph(nodes, "declines", [x, s], outputs, inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 19)]).SerializeToString()


def test_declined_nodes_carry_openvinos_reason() -> None:
    data = _declining_model()
    session = epctx.InferenceSession(data, providers=PROVIDERS)
    where = {n: ep for ep, nodes in session.get_partitions() for n in nodes}
    assert where == {
        "pad_wrap": "CPUExecutionProvider",
        "resize_crop": "CPUExecutionProvider",
        "relu": "OpenVINOExecutionProvider",
        "normalizer": "CPUExecutionProvider",
    }
    reasons = {node: why["OpenVINOExecutionProvider"] for node, why in session.get_fallback_reasons().items()}
    assert set(reasons) == {"pad_wrap", "resize_crop", "normalizer"}
    assert "Unsupported padding mode: [wrap]" in reasons["pad_wrap"]
    assert "tf_crop_and_resize" in reasons["resize_crop"] and "not supported" in reasons["resize_crop"]
    assert "no conversion rule for StringNormalizer" in reasons["normalizer"]
    assert all("src/" not in why for why in reasons.values())  # OpenVINO's words, not its source locations
    feeds = {
        "x": np.random.rand(1, 1, 4, 4).astype(np.float32),
        "s": np.array(["ab", "Cd", "e"], dtype=object),
    }
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    for got, want in zip(session.run(None, feeds), expected):
        if want.dtype == object:
            assert list(got) == list(want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_reasons_are_the_capabilitys_declined_nodes() -> None:
    """EP contract v2: OpenVINO returns its reasons in ``Capability.declined`` with what it claims (nothing to
    ask after get_capability: the EP keeps no state between the two)."""
    model = load_model(_declining_model(), infer_types=True).model
    ep = OpenVINOExecutionProvider()
    capability = ep.get_capability(model.graph, dict(model.opset_imports), CapabilityContext())
    assert [n.name for n in capability.claimed] == ["relu"]
    reasons = {n.name: why for n, why in capability.declined.items()}
    assert set(reasons) == {"pad_wrap", "resize_crop", "normalizer"}
    assert "Unsupported padding mode: [wrap]" in reasons["pad_wrap"]
    disabled = OpenVINOExecutionProvider({"disabled_ops": "Relu"})
    capability = disabled.get_capability(model.graph, dict(model.opset_imports), CapabilityContext())
    assert capability.claimed == ()
    assert {n.name: why for n, why in capability.declined.items()}["relu"] == (
        "Relu is in the provider option disabled_ops"
    )
    assert not hasattr(ep, "declined_nodes")


@pytest.mark.slow
def test_real_model_every_declined_node_has_a_reason() -> None:
    """silero-vad's opset-15 export: OpenVINO's frontend cannot translate nodes of unknown rank and the
    device's query leaves the If nodes out; every node that OpenVINO does not run says why, in its words."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the silero_vad wheel is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad_16k_op15.onnx"
    session = epctx.InferenceSession(str(path), providers=PROVIDERS)
    elsewhere = [n for ep, nodes in session.get_partitions() if ep != PROVIDERS[0] for n in nodes]
    reasons = session.get_fallback_reasons()
    assert elsewhere and all(reasons.get(n, {}).get(PROVIDERS[0]) for n in elsewhere)
    texts = " | ".join(r[PROVIDERS[0]] for r in reasons.values())
    assert "The input data tensor's rank has to be known" in texts  # the frontend's Conv translator
    assert "(Core.query_model)" in texts  # the device's verdict on the If nodes


def test_report_parsing() -> None:
    """The parser on OpenVINO's report format (as ``FrontEnd.convert`` prints it in 2026.x)."""
    report = (
        "Model wasn't fully converted. Failed operations detailed log:\n"
        "-- DFT-19 with a message:\n"
        "While validating ONNX node '<Node(DFT): dft>': Check 'x' failed at src/core/a.hpp:34:\n"
        "While validating node 'opset7::DFT DFT_13 (...)' with friendly_name 'DFT_13':\n"
        "The last dimension of input data must be 2.\n\n"
        "Summary:\n"
        "-- No conversion rule found for operations: my.dom.Foo, StringNormalizer-18\n"
        "-- Conversion is failed for: DFT-19\n"
    )
    dft = onnx_ir_node("DFT", "dft", "")
    foo = onnx_ir_node("Foo", "foo", "my.dom")
    other = onnx_ir_node("Bar", "bar", "")
    reasons = node_reasons(report, [dft, foo, other])
    assert (
        reasons[dft]
        == "OpenVINO's ONNX frontend failed to convert DFT-19: The last dimension of input data must be 2."
    )
    assert reasons[foo] == "OpenVINO's ONNX frontend has no conversion rule for my.dom.Foo"
    assert "could not translate" in reasons[other]


def onnx_ir_node(op_type: str, name: str, domain: str):
    import onnx_ir as ir

    return ir.Node(domain, op_type, [], name=name)
