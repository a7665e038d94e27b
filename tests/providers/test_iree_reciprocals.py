"""HardSwish and divisions by constants as products (``epctx.providers.iree.reciprocals``, in every IREE job with a
``HardSwish`` or a ``Div``): the rewritten graph computes what the original did (onnxruntime on both graphs: HardSwish
to the float, divisions within an ulp or two), and what it must not touch stays: divisions by a value computed or fed
at run time, by an initializer a graph input overrides, by zero, by an integer, by a constant whose reciprocal
overflows; a float64 HardSwish. IREE compiling a real model with it is tests/providers/test_iree_corpus_models.py's;
speed is in the module's docstring."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from epctx.providers.iree.reciprocals import divisions_as_products
from tests.oracle import run_ort
from tests.requires import requires


def _model(
    nodes: list, inits: list, elem: int = TensorProto.FLOAT, inputs: tuple[str, ...] = ("x",)
) -> onnx.ModelProto:
    values = [helper.make_tensor_value_info(name, elem, [2, 3, 4]) for name in inputs]
    y = helper.make_tensor_value_info("y", elem, [2, 3, 4])
    graph = helper.make_graph(nodes, "g", values, [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _rewritten(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    count = divisions_as_products(copy)
    onnx.checker.check_model(copy, full_check=True)
    return copy, count


def _x(dtype: type = np.float32) -> np.ndarray:
    return (np.random.default_rng(0).standard_normal((2, 3, 4)) * 5).astype(dtype)


def test_hardswish_becomes_products_and_computes_the_same() -> None:
    model = _model([helper.make_node("HardSwish", ["x"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], [])
    rewritten, count = _rewritten(model)
    assert count == 1
    assert [n.op_type for n in rewritten.graph.node] == ["Mul", "Add", "Clip", "Mul", "Relu"]
    x = _x()
    x[0, 0, :4] = [-3.0, 3.0, 0.0, -2.5]  # the clip's edges
    (expected,) = run_ort(model, {"x": x})
    (got,) = run_ort(rewritten, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_a_paddle_hardswish_division_becomes_a_product() -> None:
    # Paddle's export: x * clip(x + 3, 0, 6) / 6, the divisor a Constant node turned into an initializer, shared
    nodes = [
        helper.make_node("Add", ["x", "three"], ["a"]),
        helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
        helper.make_node("Mul", ["x", "c"], ["m"]),
        helper.make_node("Div", ["m", "six"], ["d"]),
        helper.make_node("Div", ["d", "six"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(v, np.float32), n)
        for n, v in (("three", 3), ("zero", 0), ("six", 6))
    ]
    model = _model(nodes, inits)
    rewritten, count = _rewritten(model)
    assert count == 2
    assert [n.op_type for n in rewritten.graph.node] == ["Add", "Clip", "Mul", "Mul", "Mul"]
    assert len(rewritten.graph.initializer) == 4  # one reciprocal for the two divisions by "six"
    x = _x()
    (expected,) = run_ort(model, {"x": x})
    (got,) = run_ort(rewritten, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=3e-7, atol=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_division_by_a_broadcast_constant_tensor(dtype: type) -> None:
    divisor = np.array([[0.5], [3.0], [-7.25]], dtype)  # (3, 1): broadcast over the last axis
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    model = _model(
        [helper.make_node("Div", ["x", "d"], ["y"])], [numpy_helper.from_array(divisor, "d")], elem
    )
    rewritten, count = _rewritten(model)
    assert count == 1
    (rcp,) = [t for t in rewritten.graph.initializer if t.name != "d"]
    assert numpy_helper.to_array(rcp).dtype == dtype
    x = _x(dtype)
    (expected,) = run_ort(model, {"x": x})
    (got,) = run_ort(rewritten, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=4 * np.finfo(dtype).eps, atol=0)
    np.testing.assert_array_equal(got[:, 0], expected[:, 0])  # a power of two: exact


LEFT_ALONE = {
    "a divisor computed at run time": ([helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Div", ["x", "e"], ["y"])], []),
    "a divisor with a zero": ([helper.make_node("Div", ["x", "d"], ["y"])], [numpy_helper.from_array(np.array([2.0, 0.0, 1.0, 1.0], np.float32), "d")]),
    "a divisor whose reciprocal overflows": ([helper.make_node("Div", ["x", "d"], ["y"])], [numpy_helper.from_array(np.array(1e-39, np.float32), "d")]),
    "an infinite divisor": ([helper.make_node("Div", ["x", "d"], ["y"])], [numpy_helper.from_array(np.array(np.inf, np.float32), "d")]),
    "the constant divided": ([helper.make_node("Div", ["d", "x"], ["y"])], [numpy_helper.from_array(np.array(6.0, np.float32), "d")]),
}  # fmt: skip


@pytest.mark.parametrize(("nodes", "inits"), LEFT_ALONE.values(), ids=list(LEFT_ALONE))
def test_divisions_it_must_not_touch(nodes: list, inits: list) -> None:
    model = _model(nodes, inits)
    rewritten, count = _rewritten(model)
    assert count == 0
    assert rewritten == model


def test_an_integer_division_an_overridable_divisor_and_a_float64_hardswish_stay() -> None:
    ints = _model([helper.make_node("Div", ["x", "d"], ["y"])], [numpy_helper.from_array(np.array(3, np.int64), "d")],
                  TensorProto.INT64)  # fmt: skip
    assert _rewritten(ints)[1] == 0
    # an initializer that is also a graph input: the caller may feed another divisor
    fed = _model([helper.make_node("Div", ["x", "d"], ["y"])], [numpy_helper.from_array(np.full((2, 3, 4), 6, np.float32), "d")],
                 inputs=("x", "d"))  # fmt: skip
    assert _rewritten(fed)[1] == 0
    wide = _model([helper.make_node("HardSwish", ["x"], ["y"])], [], TensorProto.DOUBLE)
    assert _rewritten(wide)[1] == 0


def _activation_net() -> onnx.ModelProto:
    """A conv net's activations as PyTorch exports them (HardSwish) and as Paddle does (x * clip(x + 3, 0, 6) / 6)."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2, "w1"),
        numpy_helper.from_array(rng.standard_normal((16, 16, 1, 1)).astype(np.float32) * 0.2, "w2"),
        *(
            numpy_helper.from_array(np.array(v, np.float32), n)
            for n, v in (("three", 3), ("zero", 0), ("six", 6))
        ),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("HardSwish", ["c1"], ["h1"]),
        helper.make_node("Conv", ["h1", "w2"], ["c2"]),
        helper.make_node("Add", ["c2", "three"], ["a"]),
        helper.make_node("Clip", ["a", "zero", "six"], ["k"]),
        helper.make_node("Mul", ["c2", "k"], ["m"]),
        helper.make_node("Div", ["m", "six"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 12, 12])
    graph = helper.make_graph(nodes, "act", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.slow
@requires("iree.runtime", "iree.compiler")
def test_iree_compiles_the_products_and_matches_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    import epctx
    from epctx.providers.iree import compile as iree_compile
    from epctx.providers.iree.options import REWRITE_DIVISIONS

    made: list[list[str]] = []
    real = iree_compile._optional_rewrites

    def spy(partition: object, flags: list[str]) -> list[str]:
        found = real(partition, flags)  # type: ignore[arg-type]
        made.append(found)
        assert REWRITE_DIVISIONS not in iree_compile._job_flags(partition, flags)  # type: ignore[arg-type]
        return found

    monkeypatch.setattr(iree_compile, "_optional_rewrites", spy)
    data = _activation_net().SerializeToString()
    sess = epctx.InferenceSession(data, providers=["IREEExecutionProvider"])
    assert [ep for ep, _ in sess.get_partitions()] == ["IREEExecutionProvider"]
    assert made and all(REWRITE_DIVISIONS in found for found in made)
    x = np.random.default_rng(4).standard_normal((1, 8, 12, 12)).astype(np.float32) * 3
    (got,) = sess.run(None, {"x": x})
    (expected,) = run_ort(data, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@requires("iree.runtime", "iree.compiler")
def test_a_division_by_a_large_constant_keeps_the_models_own_parameters() -> None:
    """A divisor of at least ``PARAMETER_MIN_ELEMENTS`` values is one of IREE's parameters, which the EP serves
    from the model's own initializers (weightless and refit included): its reciprocal is computed in the graph
    (``Reciprocal``), never a new initializer the model does not have."""
    import epctx
    from epctx.providers.iree.node_rewrites import PARAMETER_MIN_ELEMENTS

    channels = 128
    assert channels >= PARAMETER_MIN_ELEMENTS
    rng = np.random.default_rng(8)
    divisor = (rng.random((1, channels, 1, 1)) + 0.5).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Div", ["c", "scale"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(rng.standard_normal((channels, 8, 3, 3)).astype(np.float32) * 0.1, "w"),
        numpy_helper.from_array(divisor, "scale"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 6, 6])
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits))
    model.opset_import[0].version = 17
    rewritten, count = _rewritten(model)
    assert count == 1 and {t.name for t in rewritten.graph.initializer} == {"w", "scale"}
    data = model.SerializeToString()
    sess = epctx.InferenceSession(data, providers=["IREEExecutionProvider"])
    assert [ep for ep, _ in sess.get_partitions()] == ["IREEExecutionProvider"]
    feed = {"x": rng.standard_normal((1, 8, 6, 6)).astype(np.float32)}
    np.testing.assert_allclose(sess.run(None, feed)[0], run_ort(data, feed)[0], rtol=1e-5, atol=1e-6)
