"""OpenVINO takes control-flow bodies (``session.partition_control_flow_bodies=1``): the nodes inside If / Loop
bodies are partitioned among the EPs as the main graph's are, compiled where OpenVINO's frontend can, and the
results match onnxruntime. silero-vad ships a model whose 687 nodes sit inside If bodies (with nested Ifs
whose branches disagree on rank: OpenVINO cannot translate the bodies whole, it takes the pieces between)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto

import epctx
from epctx.partition.placement import BODY_NOT_OFFERED

pytest.importorskip("openvino")
ort = pytest.importorskip("onnxruntime")

OV = "OpenVINOExecutionProvider"
CPU = "CPUExecutionProvider"
KEY = "session.partition_control_flow_bodies"


def _session(source: str | bytes, tmp_path: Path, *, bodies: bool) -> epctx.InferenceSession:
    options = epctx.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / f"profile_{int(bodies)}")
    if bodies:
        options.add_session_config_entry(KEY, "1")
    return epctx.InferenceSession(source, options, providers=[OV])


def _compiled_on_openvino(session: epctx.InferenceSession) -> int:
    """The partitions OpenVINO compiled for this session (the profile's ``<partition>_compile`` events)."""
    events = json.loads(Path(session.end_profiling()).read_text())
    return sum(1 for e in events if e["name"].endswith("_compile") and e["args"].get("provider") == OV)


def _silero() -> Path:
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the silero_vad wheel is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"


@pytest.mark.slow
def test_silero_vad_bodies_on_openvino_match_onnxruntime(tmp_path: Path) -> None:
    path = str(_silero())
    ours = _session(path, tmp_path, bodies=True)
    oracle = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for sr, samples in ((16000, 512), (8000, 256)):  # the two branches of the top-level If
        state = expected_state = np.zeros((2, 1, 128), np.float32)
        for _ in range(8):  # a stream of chunks, the state carried over
            chunk = (rng.standard_normal((1, samples)) * 0.3).astype(np.float32)
            rate = np.array(sr, np.int64)
            want, expected_state = oracle.run(None, {"input": chunk, "state": expected_state, "sr": rate})
            got, state = ours.run(None, {"input": chunk, "state": state, "sr": rate})
            np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)
            np.testing.assert_allclose(state, expected_state, atol=1e-4, rtol=1e-3)
    # Main graph: two partitions (the Constant and Equal choosing the branch; the Identity nodes after the If,
    # which OpenVINO's frontend declines). Each branch: its encoder, LSTM cell and decoder compiled by
    # OpenVINO, three partitions per branch.
    assert _compiled_on_openvino(ours) == 8
    # The placement shows the bodies' nodes: most on OpenVINO, the rest with a reason (the cost rule for the
    # small partitions, OpenVINO's own words for the others).
    inside = [p for p in ours.get_node_placement() if p.graph.startswith("If_0/")]
    on_ov = [p for p in inside if p.provider == OV]
    assert len(inside) > 600 and len(on_ov) > len(inside) / 2
    assert len({p.partition for p in on_ov}) == 6
    assert all(p.declined and p.declined[0][0] == OV for p in inside if p.provider == CPU)
    assert any("cost rule" in p.declined[0][1] for p in inside if p.provider == CPU)


def test_bodies_stay_on_the_cpu_ep_by_default(tmp_path: Path) -> None:
    session = _session(str(_silero()), tmp_path, bodies=False)
    assert _compiled_on_openvino(session) == 2  # the main graph's: around the If
    inside = [p for p in session.get_node_placement() if p.graph]
    assert len(inside) > 600 and all(
        p.provider == CPU and p.declined == ((OV, BODY_NOT_OFFERED),) for p in inside
    )


def _loop_and_if_model() -> bytes:
    """x -> Loop(3 times: h = Slice(Pad_wrap(Relu(h @ W + b)))) -> If(flag: Sigmoid(h @ W) else Tanh(h)) -> y.
    With Pad(mode=wrap) in the Loop body, OpenVINO's device query leaves out the Loop and the If after it, so
    neither is OpenVINO's as a whole: with the bodies offered, it compiles the Loop body's MatMul -> Add -> Relu
    (the Pad stays on the CPU EP); the If's branches read the Loop's output, whose rank ONNX does not infer,
    and OpenVINO's query declines them."""
    rng = np.random.default_rng(1)
    array = onnx.numpy_helper.from_array
    inits = [
        array(rng.standard_normal((8, 8)).astype(np.float32) * 0.3, "W"),
        array(rng.standard_normal(8).astype(np.float32) * 0.1, "b"),
        array(np.array([0, 1, 0, 1], np.int64), "pads"),
        array(np.array([0, 1], np.int64), "starts"),
        array(np.array([2, 9], np.int64), "ends"),
        array(np.array(3, np.int64), "trips"),
        array(np.array(True), "true"),
    ]
    tensor = oh.make_tensor_value_info
    body = oh.make_graph(
        [
            oh.make_node("MatMul", ["h_in", "W"], ["m"], name="loop_matmul"),
            oh.make_node("Add", ["m", "b"], ["a"], name="loop_add"),
            oh.make_node("Relu", ["a"], ["r"], name="loop_relu"),
            oh.make_node("Pad", ["r", "pads"], ["p"], name="loop_pad", mode="wrap"),
            oh.make_node("Slice", ["p", "starts", "ends"], ["h_out"], name="loop_slice"),
            oh.make_node("Identity", ["cond_in"], ["cond_out"], name="loop_cond"),
        ],
        "loop_body",
        [
            tensor("i", TensorProto.INT64, []),
            tensor("cond_in", TensorProto.BOOL, []),
            tensor("h_in", 1, [2, 8]),
        ],
        [tensor("cond_out", TensorProto.BOOL, []), tensor("h_out", TensorProto.FLOAT, [2, 8])],
    )
    then = oh.make_graph(
        [
            oh.make_node("MatMul", ["h", "W"], ["t"], name="then_matmul"),
            oh.make_node("Sigmoid", ["t"], ["r"]),
        ],
        "then",
        [],
        [tensor("r", TensorProto.FLOAT, [2, 8])],
    )
    other = oh.make_graph(
        [oh.make_node("Tanh", ["h"], ["e"])], "else", [], [tensor("e", TensorProto.FLOAT, [2, 8])]
    )
    nodes = [
        oh.make_node("Loop", ["trips", "true", "x"], ["h"], name="loop", body=body),
        oh.make_node("If", ["flag"], ["y"], name="if", then_branch=then, else_branch=other),
    ]
    inputs = [tensor("x", TensorProto.FLOAT, [2, 8]), tensor("flag", TensorProto.BOOL, [])]
    graph = oh.make_graph(nodes, "loop_if", inputs, [tensor("y", TensorProto.FLOAT, [2, 8])], inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("flag", [True, False])
def test_loop_body_on_openvino_matches_onnxruntime(flag: bool, tmp_path: Path) -> None:
    data = _loop_and_if_model()
    feeds = {"x": np.random.default_rng(2).standard_normal((2, 8)).astype(np.float32), "flag": np.array(flag)}
    (want,) = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    plain, session = _session(data, tmp_path, bodies=False), _session(data, tmp_path, bodies=True)
    placed = {(p.graph, p.name): p for p in session.get_node_placement()}
    assert {k[1]: p.provider for k, p in placed.items() if not k[0]} == {"loop": CPU, "if": CPU}
    body = {name: p for (graph, name), p in placed.items() if graph == "loop/body"}
    assert {n: body[n].provider for n in ("loop_matmul", "loop_add", "loop_relu", "loop_pad")} == {
        "loop_matmul": OV, "loop_add": OV, "loop_relu": OV, "loop_pad": CPU,
    }  # fmt: skip
    assert "Unsupported padding mode: [wrap]" in dict(body["loop_pad"].declined)[OV]
    plain_body = [p for p in plain.get_node_placement() if p.graph == "loop/body"]
    assert plain_body and all(
        p.provider == CPU and p.declined == ((OV, BODY_NOT_OFFERED),) for p in plain_body
    )
    (got,) = session.run(None, feeds)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(plain.run(None, feeds)[0], want, atol=1e-5, rtol=1e-5)
    assert (_compiled_on_openvino(plain), _compiled_on_openvino(session)) == (0, 1)


def test_body_compiles_pass_the_sessions_guard(tmp_path: Path) -> None:
    """The bodies' partitions compile through the single compile point: a session that must not compile
    (``epctx.testing.no_compile``) is refused there, naming OpenVINO, although its main graph compiles nothing;
    ``session.disable_model_compile=1`` leaves the bodies on the kernel EP (the pipeline offers them to no EP)."""
    from epctx.testing import no_compile

    data = _loop_and_if_model()
    with no_compile(), pytest.raises(epctx.ModelRequiresCompilation, match=OV):
        _session(data, tmp_path, bodies=True)
    options = epctx.SessionOptions()
    options.add_session_config_entry(KEY, "1")
    options.add_session_config_entry("session.disable_model_compile", "1")
    session = epctx.InferenceSession(data, options, providers=[OV])
    assert all(p.provider == CPU for p in session.get_node_placement())


def test_declined_control_flow_says_what_openvino_said() -> None:
    """The Loop is declined with the frontend's words about the Pad inside its body (partial conversion keeps
    that placeholder inside the Loop, where the query would only say it does not support the Loop); the If
    after it, which the device's query leaves out, adds what its probe compile says: the Loop's output it
    reads has no known rank."""
    session = epctx.InferenceSession(_loop_and_if_model(), providers=[OV])
    reasons = {p.name: dict(p.declined)[OV] for p in session.get_node_placement() if not p.graph}
    assert reasons["loop"] == (
        "OpenVINO's ONNX frontend failed to convert Pad-17: Unsupported padding mode: [wrap] "
        "(node 'loop_pad' in its body)"
    )
    assert reasons["if"].startswith("OpenVINO's CPU device does not support its operation(s) If")
    assert reasons["if"].endswith(
        "compiled, the CPU plugin says: CPU plug-in doesn't support Parameter operation with dynamic rank "
        "(operation 'h')"
    )
