"""``epctx.input_shapes``: whole input shapes stated at session creation (onnxruntime's OpenVINO EP's
``reshape_input``, for every EP), anonymous dimensions included. Parsed strictly; checked against the model at
load, before type inference, so every value gets static sizes; a feed of another shape is refused with
onnxruntime's words."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import epctx
from epctx.config import INPUT_SHAPES, SessionConfig
from epctx.errors import InvalidArgument
from epctx.model import load_model
from tests.oracle import run_ort


def _model() -> bytes:
    """x[-1, 3, '?', '?'] (Paddle's anonymous dims: two '?' of different sizes) and m[batch, 4] -> y, z; the
    intermediate values' shapes come from inference only."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "?", "?"])
    m = helper.make_tensor_value_info("m", TensorProto.FLOAT, ["batch", 4])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Transpose", ["r"], ["t"], name="transpose", perm=[0, 1, 3, 2]),
        helper.make_node("Neg", ["t"], ["y"], name="neg"),
        helper.make_node("Abs", ["m"], ["z"], name="abs"),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z")]
    graph = helper.make_graph(nodes, "anonymous", [x, m], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _shape(model: ir.Model, name: str) -> list[object]:
    value = next(v for node in model.graph for v in node.outputs if v.name == name)
    assert value.shape is not None
    return [d if isinstance(d, int) else d.value for d in value.shape]


def _options(shapes: str) -> epctx.SessionOptions:
    so = epctx.SessionOptions()
    so.add_session_config_entry(INPUT_SHAPES, shapes)
    return so


def test_parsed_into_names_and_sizes() -> None:
    config = SessionConfig({INPUT_SHAPES: " x[1, 3,48,192] ,m[2,4],s[]"})
    assert config.input_shapes == (("x", (1, 3, 48, 192)), ("m", (2, 4)), ("s", ()))
    assert SessionConfig().input_shapes == ()
    assert SessionConfig({INPUT_SHAPES: ""}).input_shapes == ()


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("x", "expected NAME\\[d0,d1,...\\]"),
        ("x[1,2", "expected NAME"),
        ("x[1]]", "expected NAME"),
        ("[1]", "expected NAME"),
        ("x[1] m[2]", "expected NAME"),
        ("x[1],", "a comma ends"),
        ("x[1,-2]", "'-2', a negative size"),
        ("x[1..10]", "a range"),
        ("x[a]", "not a size"),
        ("x[1,,2]", "not a size"),
        ("x[1],x[2]", "'x' twice"),
    ],
)
def test_malformed_text_refused(value: str, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        _options(value)  # at add_session_config_entry, as every known key
    with pytest.raises(InvalidArgument, match=match):
        SessionConfig({INPUT_SHAPES: value})


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("y[1,3,4,5]", "'y' is not an input of the model \\(its inputs: x, m\\)"),
        ("x[1,3,4]", "'x' has rank 4 in the model, the shape stated \\[1, 3, 4\\] has rank 3"),
        ("x[1,2,4,5]", "'x' dimension 1 is fixed at 3 in the model, the shape stated has 2"),
    ],
)
def test_shapes_that_do_not_fit_the_model_refused_at_creation(value: str, match: str) -> None:
    for providers in (["CPUExecutionProvider"], ["ExampleExecutionProvider"]):
        with pytest.raises(InvalidArgument, match=match):
            epctx.InferenceSession(_model(), _options(value), providers=providers)


def test_a_conflicting_free_dimension_override_refused() -> None:
    so = _options("m[2,4]")
    so.add_free_dimension_override_by_name("batch", 3)
    with pytest.raises(InvalidArgument, match="'m' dimension 0 is stated 2, .* of 'batch' sets it to 3"):
        epctx.InferenceSession(_model(), so, providers=["CPUExecutionProvider"])
    so = _options("x[1,3,4,5]")
    so.add_free_dimension_override_by_name("x:2", 6)
    with pytest.raises(InvalidArgument, match="'x' dimension 2 is stated 4, .* of 'x:2' sets it to 6"):
        epctx.InferenceSession(_model(), so, providers=["CPUExecutionProvider"])
    agreeing = _options("m[2,4]")
    agreeing.add_free_dimension_override_by_name("batch", 2)
    sess = epctx.InferenceSession(_model(), agreeing, providers=["CPUExecutionProvider"])
    assert sess.get_inputs()[1].shape == [2, 4]


def test_stated_shapes_reach_every_value_before_type_inference() -> None:
    data = _model()
    plain = load_model(data, infer_types=True).model
    assert _shape(plain, "t")[1] == 3 and not isinstance(_shape(plain, "t")[2], int)
    stated = load_model(data, infer_types=True, input_shapes=[("x", (2, 3, 4, 5)), ("m", (2, 4))]).model
    assert [list(v.shape) for v in stated.graph.inputs] == [[2, 3, 4, 5], [2, 4]]  # type: ignore[arg-type]
    assert _shape(stated, "r") == [2, 3, 4, 5]
    assert _shape(stated, "t") == [2, 3, 5, 4]
    assert _shape(stated, "y") == [2, 3, 5, 4]
    assert _shape(stated, "z") == [2, 4]


def test_an_input_of_unknown_rank_gets_the_stated_shape() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [])
    graph.output.extend([helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    loaded = load_model(data, infer_types=True, input_shapes=[("x", (2, 3))]).model
    assert _shape(loaded, "y") == [2, 3]


@pytest.mark.parametrize("ep", ["CPUExecutionProvider", "ExampleExecutionProvider"])
def test_runs_at_the_stated_shape_and_refuses_another(ep: str) -> None:
    data = _model()
    sess = epctx.InferenceSession(data, _options("x[2,3,4,5],m[2,4]"), providers=[ep])
    assert [i.shape for i in sess.get_inputs()] == [[2, 3, 4, 5], [2, 4]]
    rng = np.random.default_rng(0)
    feed = {
        "x": rng.standard_normal((2, 3, 4, 5)).astype(np.float32),
        "m": rng.standard_normal((2, 4)).astype(np.float32),
    }
    for got, expected in zip(sess.run(None, feed), run_ort(data, feed), strict=True):
        np.testing.assert_array_equal(got, expected)
    feed["x"] = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)  # fine for the model, not as stated
    with pytest.raises(InvalidArgument) as caught:
        sess.run(None, feed)
    message = str(caught.value)
    assert "Got invalid dimensions for input: x for the following indices" in message
    assert "index: 2 Got: 5 Expected: 4" in message and "index: 3 Got: 4 Expected: 5" in message


def test_a_context_model_on_the_lean_path_still_checks_the_shapes(tmp_path: object) -> None:
    """A context model is loaded without its graph unless something needs it: a stated shape does."""
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    ctx = tmp_path / "m_ctx.onnx"
    so = _options("x[2,3,4,5],m[2,4]")
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_file_path", str(ctx))
    epctx.InferenceSession(_model(), so, providers=["ExampleExecutionProvider"])
    assert [d.dim_value for d in onnx.load(str(ctx)).graph.input[0].type.tensor_type.shape.dim] == [
        2,
        3,
        4,
        5,
    ]
    warm = epctx.InferenceSession(str(ctx), _options("x[2,3,4,5]"), providers=["ExampleExecutionProvider"])
    assert warm.get_inputs()[0].shape == [2, 3, 4, 5]
    with pytest.raises(InvalidArgument, match="'x' dimension 2 is fixed at 4 in the model"):
        epctx.InferenceSession(str(ctx), _options("x[2,3,6,5]"), providers=["ExampleExecutionProvider"])


def test_the_measured_rule_says_how_to_state_the_sizes() -> None:
    """A partition measured at chosen sizes names --dim and, for anonymous dimensions, --shape; one measured at
    static shapes says nothing of the kind."""
    from epctx.partition.measured import Measurement

    chosen = Measurement("IREEExecutionProvider", 2.0, "CPUExecutionProvider", 1.0, 10, sizes="x[2]=48")
    assert "synthetic inputs, x[2]=48;" in chosen.reason()
    assert (
        "--dim NAME=N" in chosen.reason() and "--shape INPUT[d0,...] (epctx.input_shapes)" in chosen.reason()
    )
    static = Measurement("IREEExecutionProvider", 2.0, "CPUExecutionProvider", 1.0, 10)
    assert "--shape" not in static.reason() and "--dim" not in static.reason()
