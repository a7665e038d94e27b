"""``epctx compile --shape NAME[d0,...]``: an input's whole shape stated (``epctx.input_shapes``), anonymous
dimensions included; checked as ``--dim`` is (usage errors), with ``--dim`` too; the context model's inputs carry
the stated shape, so a warm load states nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

import epctx
from epctx.testing import no_compile
from tests.cli.helpers import Cli, assert_one_error_line
from tests.oracle import run_ort

EXAMPLE = "ExampleExecutionProvider"


def _model(path: Path) -> Path:
    """x[-1, 3, '?', '?'] (Paddle's anonymous dims) and m[batch, 4] -> y, z."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "?", "?"])
    m = helper.make_tensor_value_info("m", TensorProto.FLOAT, ["batch", 4])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Transpose", ["r"], ["y"], name="transpose", perm=[0, 1, 3, 2]),
        helper.make_node("Abs", ["m"], ["z"], name="abs"),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z")]
    graph = helper.make_graph(nodes, "anonymous", [x, m], outputs)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_compile_shape_reaches_the_context_model_and_loads_warm(cli: Cli, tmp_path: Path) -> None:
    source = _model(tmp_path / "anon.onnx")
    out = tmp_path / "anon_ctx.onnx"
    result = cli(
        "compile", source, "-p", EXAMPLE, "-o", out, "-q", "--shape", "x[1,3,48,192]", "--dim", "batch=2"
    )
    assert result.status == 0, result
    dims = [[d.dim_value for d in v.type.tensor_type.shape.dim] for v in onnx.load(str(out)).graph.input]
    assert dims == [[1, 3, 48, 192], [2, 4]]
    with no_compile():
        sess = epctx.InferenceSession(str(out), providers=[EXAMPLE])
    assert [i.shape for i in sess.get_inputs()] == [[1, 3, 48, 192], [2, 4]]
    rng = np.random.default_rng(0)
    feed = {
        "x": rng.standard_normal((1, 3, 48, 192)).astype(np.float32),
        "m": rng.standard_normal((2, 4)).astype(np.float32),
    }
    for got, expected in zip(sess.run(None, feed), run_ort(source.read_bytes(), feed), strict=True):
        np.testing.assert_array_equal(got, expected)


def test_compile_shape_usage_errors(cli: Cli, tmp_path: Path) -> None:
    source = _model(tmp_path / "anon.onnx")
    compile_ = ("compile", source, "-p", EXAMPLE)
    assert_one_error_line(cli(*compile_, "--shape", "x"), 2, "--shape", "NAME[d0,d1,...]")
    assert_one_error_line(cli(*compile_, "--shape", "x[1,3,-4,5]"), 2, "--shape", "negative")
    assert_one_error_line(cli(*compile_, "--shape", "x[1,3,1..4,5]"), 2, "--shape", "a range")
    assert_one_error_line(cli(*compile_, "--shape", "x[1,3,4,5]", "--shape", "x[1,3,4,6]"), 2, "twice")
    assert_one_error_line(cli(*compile_, "--shape", "y[1]"), 2, "--shape", "'y' is not an input", "x, m")
    assert_one_error_line(cli(*compile_, "--shape", "x[1,3,4]"), 2, "--shape", "rank 4", "rank 3")
    assert_one_error_line(cli(*compile_, "--shape", "x[1,2,4,5]"), 2, "dimension 1 is fixed at 3")
    # --dim and --shape that disagree on a dimension
    conflict = cli(*compile_, "--shape", "m[3,4]", "--dim", "batch=2")
    assert_one_error_line(
        conflict, 2, "--shape", "'m' dimension 0 is stated 3", "--dim of 'batch' sets it to 2"
    )
    conflict = cli(*compile_, "--shape", "x[1,3,4,5]", "--dim", "x:2=6")
    assert_one_error_line(conflict, 2, "'x' dimension 2 is stated 4", "--dim of 'x:2' sets it to 6")
    assert not list(tmp_path.glob("*_ctx.onnx"))
