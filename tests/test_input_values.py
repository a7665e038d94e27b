"""Stated scalar input values (``epctx.input_values``) and the control flow they decide, folded at load
(``epctx.model.fold_static``); per-run specialization states them for scalars an If condition depends on
(``epctx.session.specialize``): silero-vad, whose ``If`` on ``sr`` OpenVINO cannot take, then runs on OpenVINO."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import epctx
from epctx import options as opt
from epctx.errors import InvalidArgument
from tests.oracle import run_ort

OV = "OpenVINOExecutionProvider"


def _flag_model() -> onnx.ModelProto:
    """y = Relu(x) * 2 when flag == 1, else Neg(x): an If on a scalar input, a body reading the outer x."""
    then = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "two"], ["t"])],
        "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
        initializer=[helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])],
    )  # fmt: skip
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)],
    )
    graph = helper.make_graph(
        [
            helper.make_node(
                "Constant", [], ["one"], value=helper.make_tensor("one", TensorProto.INT64, [], [1])
            ),
            helper.make_node("Equal", ["flag", "one"], ["c"]),
            helper.make_node("If", ["c"], ["y0"], then_branch=then, else_branch=other),
            helper.make_node("Sigmoid", ["y0"], ["y"]),
        ],
        "flag",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4]),
            helper.make_tensor_value_info("flag", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _options(**entries: str) -> epctx.SessionOptions:
    so = epctx.SessionOptions()
    for key, value in entries.items():
        so.add_session_config_entry(key, value)
    return so


def _feed(flag: int, n: int = 3) -> dict[str, np.ndarray]:
    x = np.random.default_rng(flag + n).standard_normal((n, 4)).astype(np.float32)
    return {"x": x, "flag": np.array(flag, np.int64)}


@pytest.mark.parametrize("flag", [1, 0])
def test_a_stated_value_folds_the_if_it_decides_and_results_match(flag: int) -> None:
    model = _flag_model()
    sess = epctx.InferenceSession(
        model.SerializeToString(), _options(**{"epctx.input_values": f"flag={flag}"})
    )
    assert not [n for n in sess.model.graph if n.op_type == "If"]  # the branch taken, inlined
    assert [i.name for i in sess.get_inputs()] == ["x", "flag"]  # still an input the feed gives
    np.testing.assert_allclose(sess.run(None, _feed(flag))[0], run_ort(model, _feed(flag))[0], rtol=1e-6)
    unfolded = epctx.InferenceSession(model.SerializeToString())
    assert [n for n in unfolded.model.graph if n.op_type == "If"]


def test_a_feed_with_another_value_is_refused() -> None:
    sess = epctx.InferenceSession(
        _flag_model().SerializeToString(), _options(**{"epctx.input_values": "flag=1"})
    )
    with pytest.raises(InvalidArgument, match=r"'flag' is 0, but this session was made for flag=1"):
        sess.run(None, _feed(0))


def test_bad_values_are_invalid_argument() -> None:
    data = _flag_model().SerializeToString()
    for text, words in (("flag", "NAME=NUMBER"), ("flag=x", "NAME=NUMBER"), ("flag=1,flag=2", "twice")):
        with pytest.raises(InvalidArgument, match=words):
            epctx.InferenceSession(data, _options(**{"epctx.input_values": text}))
    with pytest.raises(InvalidArgument, match="no input of the model"):
        epctx.InferenceSession(data, _options(**{"epctx.input_values": "sr=1"}))
    with pytest.raises(InvalidArgument, match="not a scalar input"):
        epctx.InferenceSession(data, _options(**{"epctx.input_values": "x=1"}))
    assert opt.SessionConfig.of(_options(**{"epctx.input_values": "a=1, b=0.5"})).input_values == (
        ("a", 1),
        ("b", 0.5),
    )


def test_the_deciding_scalars_are_found() -> None:
    from epctx.model.fold_static import deciding_scalars

    sess = epctx.InferenceSession(_flag_model().SerializeToString())
    assert deciding_scalars(sess.model.graph) == ["flag"]


def _silero() -> Path:
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the silero_vad wheel is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"


def _stream(sess: Any, model: Path, sr: int, chunks: int = 4) -> float:
    """Max error against onnxruntime over ``chunks`` chunks with the state carried."""
    ort = pytest.importorskip("onnxruntime")
    oracle = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(sr)
    ours = theirs = np.zeros((2, 1, 128), np.float32)
    err = 0.0
    for _ in range(chunks):
        x = ((rng.random((1, 512 if sr == 16000 else 256), dtype=np.float32) - 0.5) * 0.2).astype(np.float32)
        a = oracle.run(None, {"input": x, "state": theirs, "sr": np.array(sr, np.int64)})
        b = sess.run(None, {"input": x, "state": ours, "sr": np.array(sr, np.int64)})
        err = max(err, *(float(np.abs(p - q).max()) for p, q in zip(a, b)))
        theirs, ours = a[1], b[1]
    return err


@pytest.mark.parametrize("sr", [16000, 8000])
def test_silero_vad_with_sr_stated_has_no_if_and_matches_onnxruntime(sr: int, tmp_path: Path) -> None:
    model = _silero()
    size = 512 if sr == 16000 else 256
    so = _options(
        **{"epctx.input_values": f"sr={sr}", "epctx.input_shapes": f"input[1,{size}],state[2,1,128]"}
    )
    sess = epctx.InferenceSession(str(model), so)
    assert not [n for n in sess.model.graph if n.op_type == "If"]
    assert _stream(sess, model, sr) <= 1e-4  # the CPU EP's own rounding, folded or not
    # the fold itself changes nothing: onnxruntime on the folded model gives what it gives on the original
    import onnx_ir as ir

    folded = tmp_path / "folded.onnx"
    ir.save(sess.model, folded)
    assert _stream(_Ort(folded), model, sr) <= 1e-6  # 0.0 here; a constant folded by numpy may round apart


class _Ort:
    """onnxruntime over a model file, run as a session is."""

    def __init__(self, path: Path) -> None:
        ort = pytest.importorskip("onnxruntime")
        self._sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def run(self, names: object, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return list(self._sess.run(None, feed))


def test_silero_vad_as_shipped_runs_on_openvino_once_sr_is_seen_twice() -> None:
    pytest.importorskip("openvino")
    model = _silero()
    sess = epctx.InferenceSession(str(model), _options(**{"epctx.specialize_shapes": "sync"}), providers=[OV])
    (if_node,) = [p for p in sess.get_node_placement() if p.op_type == "If" and not p.graph]
    assert (
        if_node.provider == "CPUExecutionProvider"
    )  # OpenVINO declines the If (dynamic ranks in its bodies)
    for sr in (16000, 8000):
        assert _stream(sess, model, sr) <= 1e-3
    made = sess.get_shape_specializations()
    assert set(made) == {
        "input[1,512],state[2,1,128],sr[] with sr=16000",
        "input[1,256],state[2,1,128],sr[] with sr=8000",
    }
    for state in made.values():
        assert state.state == "ready" and state.nodes.get(OV, 0) > 100, state


def test_a_deciding_scalar_joins_the_signature_and_each_value_gets_its_session() -> None:
    pytest.importorskip("openvino")
    model = _flag_model()
    sess = epctx.InferenceSession(
        model.SerializeToString(), _options(**{"epctx.specialize_shapes": "sync"}), providers=[OV]
    )
    for flag in (1, 0, 1, 0):
        for _ in range(2):
            np.testing.assert_allclose(
                sess.run(None, _feed(flag))[0], run_ort(model, _feed(flag))[0], rtol=1e-5
            )
    made = sess.get_shape_specializations()
    assert set(made) == {"x[3,4],flag[] with flag=1", "x[3,4],flag[] with flag=0"}, made
    assert all(state.state == "ready" for state in made.values()), made
