"""Free dimension overrides reach every value before type inference (a compiler sees static shapes, not only at
the inputs), by name, by denotation, and by epctx's ``INPUT:AXIS`` for an unnamed dimension; ``epctx compile
--dim`` sets them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper

import epctx
from epctx.model import load_model
from tests.cli.helpers import Cli, assert_one_error_line
from tests.oracle import run_ort


def _model(first_dim: str | int) -> onnx.ModelProto:
    """x[first_dim, 3, ?] -> Relu -> Transpose -> y: the intermediate values' shapes come from inference only."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [first_dim, 3, None])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Transpose", ["r"], ["y"], name="transpose", perm=[2, 1, 0]),
    ]
    graph = helper.make_graph(nodes, "dims", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _shape(model: ir.Model, name: str) -> list[object]:
    value = next(v for node in model.graph for v in node.outputs if v.name == name)
    assert value.shape is not None
    return [d if isinstance(d, int) else d.value for d in value.shape]


def test_override_by_name_reaches_intermediate_values() -> None:
    data = _model("batch").SerializeToString()
    plain = load_model(data, infer_types=True).model
    assert _shape(plain, "r")[0] == "batch"
    fixed = load_model(data, infer_types=True, free_dims=({"batch": 4}, {})).model
    assert _shape(fixed, "r")[:2] == [4, 3]


def test_override_by_input_axis_for_unnamed_dimensions() -> None:
    data = _model(-1).SerializeToString()
    fixed = load_model(data, infer_types=True, free_dims=({"x:0": 2, "x:2": 5}, {})).model
    assert _shape(fixed, "r") == [2, 3, 5]
    so = epctx.SessionOptions()
    so.add_free_dimension_override_by_name("x:0", 2)
    sess = epctx.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    assert sess.get_inputs()[0].shape[0] == 2
    x = np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], run_ort(data, {"x": x})[0])


def test_a_fixed_dimension_is_never_changed() -> None:
    data = _model(7).SerializeToString()
    fixed = load_model(data, infer_types=True, free_dims=({"x:0": 2}, {})).model
    assert _shape(fixed, "r")[0] == 7


def test_compile_dim_reaches_the_compiled_model(cli: Cli, tmp_path: Path) -> None:
    source = tmp_path / "dims.onnx"
    onnx.save(_model("batch"), source)
    out = tmp_path / "dims_ctx.onnx"
    args = ("compile", source, "-p", "ExampleExecutionProvider", "-o", out, "-q")
    assert cli(*args, "--dim", "batch=3", "--dim", "x:2=4").status == 0
    sess = epctx.InferenceSession(str(out), providers=["ExampleExecutionProvider"])
    assert sess.get_inputs()[0].shape == [3, 3, 4]


def test_compile_dim_usage_errors(cli: Cli, tmp_path: Path) -> None:
    source = tmp_path / "dims.onnx"
    onnx.save(_model("batch"), source)
    assert_one_error_line(cli("compile", source, "--dim", "batch"), 2, "--dim", "NAME=N")
    assert_one_error_line(cli("compile", source, "--dim", "batch=-1"), 2, "--dim")
    assert_one_error_line(cli("compile", source, "--dim", "b=1", "--dim", "b=2"), 2, "twice")
    # a name the model's inputs lack: refused, naming the dynamic dimensions there are
    assert_one_error_line(cli("compile", source, "--dim", "bacth=1"), 2, "bacth", "batch, x:2")


def test_a_graph_output_of_unknown_rank_stays_unranked() -> None:
    """The checker's copy gives such an output an empty shape; inference must not make it rank 0 (a compiled
    partition would then return a scalar: IREE's 'tensor.cast' failure on a Conv feeding the output)."""
    data = _model("batch").SerializeToString()  # y is declared without a shape
    loaded = load_model(data, infer_types=True).model
    assert loaded.graph.outputs[0].shape is None or len(loaded.graph.outputs[0].shape) == 3
