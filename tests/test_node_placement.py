"""Placement you can see, from the library: ``InferenceSession.get_node_placement()`` (per node: the EP that
runs it, its partition, why each EP ahead declined it), ``ModelCompiler.get_node_placement()``, the profile's
``node_placement`` event and ``placement_summary``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto

import epctx
from epctx.partition.placement import NO_REASON, NodePlacement, placement_summary
from tests.epcontext.models import EXAMPLE, two_partition_model

OV = "OpenVINOExecutionProvider"
CPU = "CPUExecutionProvider"


def test_every_node_with_its_ep_partition_and_reasons() -> None:
    session = epctx.InferenceSession(two_partition_model().SerializeToString(), providers=[EXAMPLE])
    placement = session.get_node_placement()
    assert [p.name for p in placement] == ["mm1", "relu", "ln", "mm2", "add", "sig"]
    assert [p.index for p in placement] == list(range(6))
    by = {p.name: p for p in placement}
    assert by["ln"].provider == CPU and by["ln"].partition is None
    assert by["ln"].declined == ((EXAMPLE, NO_REASON),)  # the Example EP gives no reason: said so
    assert {by[n].partition for n in ("mm1", "relu")} != {by[n].partition for n in ("mm2", "add", "sig")}
    assert all(
        by[n].provider == EXAMPLE and by[n].declined == () for n in ("mm1", "relu", "mm2", "add", "sig")
    )
    # the same story as get_partitions, node by node
    for ep, names in session.get_partitions():
        assert {by[n].provider for n in names} == {ep}
    summary = placement_summary(placement)
    assert summary["nodes_per_provider"] == {EXAMPLE: 5, CPU: 1}
    assert summary["partitions_per_provider"] == {EXAMPLE: 2}
    assert summary["top_reasons"] == [{"provider": EXAMPLE, "reason": NO_REASON, "nodes": 1, "example": "ln"}]
    assert json.loads(json.dumps([p.to_dict() for p in placement]))[2]["declined"] == {EXAMPLE: NO_REASON}


def _wrap_pad_model() -> onnx.ModelProto:
    """Relu -> Pad(mode=wrap, which OpenVINO's frontend refuses) -> Relu -> Sigmoid, with one unnamed node."""
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
    nodes = [
        oh.make_node("Relu", ["x"], ["a"], name="first"),
        oh.make_node("Pad", ["a", "pads"], ["b"], name="wrap_pad", mode="wrap"),
        oh.make_node("Relu", ["b"], ["c"]),  # unnamed: placement still lists it, by index
        oh.make_node("Sigmoid", ["c"], ["y"], name="last"),
    ]
    pads = onnx.numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")
    out = oh.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = oh.make_graph(nodes, "wrap_pad", [x], [out], [pads])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 19)])


def test_openvinos_reason_in_the_placement() -> None:
    pytest.importorskip("openvino")
    session = epctx.InferenceSession(_wrap_pad_model().SerializeToString(), providers=[OV])
    placement = session.get_node_placement()
    assert [(p.name, p.provider) for p in placement] == [
        ("first", OV),
        ("wrap_pad", CPU),
        ("", OV),
        ("last", OV),
    ]
    ((ep, why),) = placement[1].declined
    assert ep == OV and "Unsupported padding mode: [wrap]" in why
    assert placement[0].partition != placement[2].partition == placement[3].partition


def test_profile_has_the_placement(tmp_path: Path) -> None:
    options = epctx.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "profile")
    session = epctx.InferenceSession(two_partition_model().SerializeToString(), options, providers=[EXAMPLE])
    session.run(None, {"x": np.ones((2, 8), np.float32)})
    events = json.loads(Path(session.end_profiling()).read_text())
    (event,) = [e for e in events if e["name"] == "node_placement"]
    assert event["cat"] == "Session" and event["ph"] == "X"
    assert event["args"]["nodes"] == [p.to_dict() for p in session.get_node_placement()]


def test_compiler_and_context_model(tmp_path: Path) -> None:
    source = tmp_path / "m.onnx"
    onnx.save(two_partition_model(), source)
    options = epctx.SessionOptions()
    options.add_provider(EXAMPLE, {})
    compiler = epctx.ModelCompiler(options, str(source))
    assert compiler.get_node_placement() == []
    compiler.compile_to_file(str(tmp_path / "m_ctx.onnx"))
    placed = compiler.get_node_placement()
    assert [p.provider for p in placed] == [EXAMPLE, EXAMPLE, CPU, EXAMPLE, EXAMPLE, EXAMPLE]
    # the context model: its EPContext nodes on the EP that loads them, the CPU node as before
    session = epctx.InferenceSession(str(tmp_path / "m_ctx.onnx"), providers=[EXAMPLE])
    loaded = session.get_node_placement()
    assert all(isinstance(p, NodePlacement) for p in loaded)
    contexts = [p for p in loaded if p.op_type == "EPContext"]
    assert len(contexts) == 2 and all(p.provider == EXAMPLE and p.declined == () for p in contexts)


def test_context_model_on_the_lean_path(tmp_path: Path) -> None:
    """A context model of EPContext nodes only loads without onnx-ir; its placement is made when asked for."""
    from tests.epcontext.models import whole_model

    source = tmp_path / "w.onnx"
    onnx.save(whole_model(), source)
    options = epctx.SessionOptions()
    options.add_provider(EXAMPLE, {})
    epctx.ModelCompiler(options, str(source)).compile_to_file(str(tmp_path / "w_ctx.onnx"))
    session = epctx.InferenceSession(str(tmp_path / "w_ctx.onnx"), providers=[EXAMPLE])
    (only,) = session.get_node_placement()
    assert (only.op_type, only.provider, only.declined) == ("EPContext", EXAMPLE, ())
    assert only.partition == only.name == session.get_partitions()[0][1][0]


def test_control_flow_bodies_in_the_placement_and_the_page() -> None:
    """A body's nodes follow their control-flow node (``graph``: the body's path), and the page lists them in
    that node's details."""
    from epctx.partition.placement import BODY_NOT_OFFERED
    from epctx.partition.placement_page import page_data
    from tests.providers.test_openvino_bodies import _loop_and_if_model

    session = epctx.InferenceSession(_loop_and_if_model(), providers=[EXAMPLE])
    placement = session.get_node_placement()
    assert [(p.graph, p.name or p.op_type) for p in placement][:3] == [
        ("", "loop"),
        ("loop/body", "loop_matmul"),
        ("loop/body", "loop_add"),
    ]
    assert {p.graph for p in placement} == {"", "loop/body", "if/then_branch", "if/else_branch"}
    assert all(p.provider == CPU for p in placement if p.graph)
    assert all(p.declined == ((EXAMPLE, BODY_NOT_OFFERED),) for p in placement if p.graph)
    data = page_data(session.model.graph, placement, title="t")
    assert [n["name"] for n in data["nodes"]] == ["loop", "if"]
    assert data["nodes"][0]["bodies"] == {"loop/body": {CPU: 6}}
    assert data["nodes"][1]["bodies"] == {"if/then_branch": {CPU: 2}, "if/else_branch": {CPU: 1}}
    assert {p["name"]: p["in_bodies"] for p in data["providers"]}[CPU] == 9
