"""0-size dimensions (an empty batch) on the CPU EP: shapes and dtypes as onnxruntime's CPU EP gives them."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.oracle import assert_matches_ort

_RNG = np.random.default_rng(0)


def _f(*shape: int) -> np.ndarray:
    return _RNG.standard_normal(shape).astype(np.float32)


def _model(
    op: str,
    feeds: dict[str, np.ndarray],
    consts: dict[str, np.ndarray] | None = None,
    *,
    outputs: int = 1,
    opset: int = 17,
    **attrs: Any,
) -> onnx.ModelProto:
    """One ``op`` node: ``feeds`` are graph inputs with a symbolic first dimension, ``consts`` initializers."""
    consts = consts or {}
    inputs = [
        helper.make_tensor_value_info(
            name,
            helper.np_dtype_to_tensor_dtype(value.dtype),
            ["N", *value.shape[1:]] if value.ndim else [],
        )
        for name, value in feeds.items()
    ]
    outs = [f"y{k}" for k in range(outputs)]
    node = helper.make_node(op, [*feeds, *consts], outs, name=op.lower(), **attrs)
    graph = helper.make_graph(
        [node],
        "zero",
        inputs,
        [onnx.ValueInfoProto(name=o) for o in outs],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    model = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    )
    # Outputs keep the inferred element type, not a shape (the point is what shape each runtime gives).
    del model.graph.value_info[:]
    for out in model.graph.output:
        out.type.tensor_type.ClearField("shape")
        if not out.type.tensor_type.elem_type:  # not inferred (function ops): the first input's type
            out.type.tensor_type.elem_type = inputs[0].type.tensor_type.elem_type
    return model


def _cases() -> list[Any]:
    x = _f(0, 5)
    img = _f(0, 3, 8, 8)
    seq = _f(0, 4, 6)
    cases = [
        ("MatMul", {"x": x}, {"w": _f(5, 7)}, {}),
        ("Gemm", {"x": x}, {"w": _f(5, 7), "b": _f(7)}, {}),
        ("Gemm_transB", {"x": x}, {"w": _f(7, 5), "b": _f(7)}, {"transB": 1}),
        ("Conv", {"x": img}, {"w": _f(4, 3, 3, 3), "b": _f(4)}, {"pads": [1, 1, 1, 1]}),
        ("Conv_group", {"x": img}, {"w": _f(3, 1, 3, 3)}, {"group": 3}),
        ("Conv_depthwise", {"x": img}, {"w": _f(6, 1, 3, 3), "b": _f(6)}, {"group": 3, "pads": [1, 1, 1, 1]}),
        ("Conv_pointwise", {"x": img}, {"w": _f(4, 3, 1, 1)}, {}),
        ("Conv_1d", {"x": seq}, {"w": _f(2, 4, 3)}, {}),
        ("ConvTranspose", {"x": img}, {"w": _f(3, 2, 3, 3), "b": _f(2)}, {}),
        ("Softmax", {"x": x}, {}, {"axis": -1}),
        ("LogSoftmax", {"x": x}, {}, {"axis": -1}),
        ("Relu", {"x": x}, {}, {}),
        ("Sigmoid", {"x": x}, {}, {}),
        ("Gelu", {"x": x}, {}, {"opset": 20}),
        ("Add", {"x": x}, {"b": _f(5)}, {}),
        ("Mul", {"x": x}, {"b": _f(1, 5)}, {}),
        ("Reshape", {"x": seq}, {"s": np.array([0, 24], np.int64)}, {}),
        ("Reshape_infer", {"x": seq}, {"s": np.array([2, -1], np.int64)}, {}),
        ("Reshape_copy0", {"x": seq}, {"s": np.array([-1, 0], np.int64)}, {}),
        ("Reshape_neg", {"x": seq}, {"s": np.array([-1, 6], np.int64)}, {}),
        ("Flatten", {"x": img}, {}, {"axis": 1}),
        ("Concat", {"x": x, "z": _f(0, 5)}, {}, {"axis": 1}),
        ("Concat_batch", {"x": x}, {"z": _f(2, 5)}, {"axis": 0}),
        ("ReduceMean", {"x": seq}, {"axes": np.array([-1], np.int64)}, {"keepdims": 1, "opset": 18}),
        ("ReduceMean_batch", {"x": seq}, {"axes": np.array([0], np.int64)}, {"keepdims": 0, "opset": 18}),
        ("ReduceSum", {"x": seq}, {"axes": np.array([1], np.int64)}, {"opset": 18}),
        ("ReduceMax", {"x": seq}, {"axes": np.array([2], np.int64)}, {"opset": 18}),
        *(
            (f"{op}_batch", {"x": seq}, {"axes": np.array([0], np.int64)}, {"opset": 18})
            for op in (
                "ReduceSum",
                "ReduceMax",
                "ReduceMin",
                "ReduceProd",
                "ReduceL1",
                "ReduceL2",
                "ReduceLogSumExp",
                "ReduceSumSquare",
                "ReduceLogSum",
            )
        ),
        ("LayerNormalization", {"x": seq}, {"s": _f(6), "b": _f(6)}, {"axis": -1}),
        (
            "BatchNormalization",
            {"x": img},
            {"s": _f(3), "b": _f(3), "m": _f(3), "v": np.ones(3, np.float32)},
            {},
        ),
        ("InstanceNormalization", {"x": img}, {"s": _f(3), "b": _f(3)}, {}),
        ("MaxPool", {"x": img}, {}, {"kernel_shape": [2, 2], "strides": [2, 2]}),
        ("AveragePool", {"x": img}, {}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
        ("GlobalAveragePool", {"x": img}, {}, {}),
        ("GlobalMaxPool", {"x": img}, {}, {}),
        ("Transpose", {"x": seq}, {}, {"perm": [2, 0, 1]}),
        ("Gather", {"x": x}, {"i": np.array([0, 2], np.int64)}, {"axis": 1}),
        ("Gather_batch_indices", {"x": _f(4, 5), "i": np.zeros((0, 3), np.int64)}, {}, {"axis": 0}),
        (
            "Slice",
            {"x": seq},
            {"st": np.array([1], np.int64), "en": np.array([3], np.int64), "ax": np.array([1], np.int64)},
            {},
        ),
        ("Split", {"x": x}, {"sp": np.array([2, 3], np.int64)}, {"axis": 1, "outputs": 2}),
        ("Squeeze", {"x": _f(0, 1, 5)}, {"ax": np.array([1], np.int64)}, {}),
        ("Unsqueeze", {"x": x}, {"ax": np.array([1], np.int64)}, {}),
        ("Shape", {"x": seq}, {}, {}),
        ("Cast", {"x": x}, {}, {"to": TensorProto.INT64}),
        ("Where", {"c": np.zeros((0, 5), bool), "x": x}, {"z": _f(5)}, {}),
        ("ArgMax", {"x": x}, {}, {"axis": 1}),
        ("TopK", {"x": x}, {"k": np.array([2], np.int64)}, {"axis": 1, "outputs": 2}),
        ("Expand", {"x": _f(0, 1)}, {"s": np.array([1, 5], np.int64)}, {}),
        ("Pad", {"x": x}, {"p": np.array([0, 1, 0, 1], np.int64)}, {}),
        ("Tile", {"x": x}, {"r": np.array([2, 2], np.int64)}, {}),
        (
            "Resize",
            {"x": img},
            {"roi": np.zeros(0, np.float32), "sc": np.array([1, 1, 2, 2], np.float32)},
            {},
        ),
        ("Einsum", {"x": x}, {"w": _f(5, 7)}, {"equation": "bi,ij->bj"}),
    ]
    params = []
    for label, feeds, consts, attrs in cases:
        op = label.split("_")[0]
        params.append(pytest.param(op, feeds, consts, dict(attrs), id=label))
    return params


@pytest.mark.parametrize(("op", "feeds", "consts", "attrs"), _cases())
def test_zero_size_batch_matches_onnxruntime(op, feeds, consts, attrs):
    outputs = attrs.pop("outputs", 1)
    opset = attrs.pop("opset", 17)
    model = _model(op, feeds, consts, outputs=outputs, opset=opset, **attrs)
    assert_matches_ort(model, feeds)


def test_zero_size_reshape_with_an_inferred_dimension_fails_like_onnxruntime():
    """Shape [0, -1] on a (0, 4, 6) input: -1 cannot be inferred (0 / 0); onnxruntime fails too (FAIL)."""
    import epctx
    from tests.oracle import run_epctx, run_ort

    x = _f(0, 4, 6)
    model = _model("Reshape", {"x": x}, {"s": np.array([0, -1], np.int64)})
    with pytest.raises(Exception, match="cannot be reshaped"):
        run_ort(model, {"x": x})
    with pytest.raises(epctx.Fail, match="Reshape node. Name:'reshape'"):
        run_epctx(model, {"x": x})


def test_zero_size_group_normalization_gives_an_empty_batch():
    """onnxruntime's function expansion of GroupNormalization-21 fails on a batch of 0 (Reshape to [0, 2, -1]);
    epctx returns the empty batch."""
    from tests.oracle import run_epctx

    x = _f(0, 4, 3, 3)
    model = _model("GroupNormalization", {"x": x}, {"s": _f(4), "b": _f(4)}, opset=21, num_groups=2)
    (y,) = run_epctx(model, {"x": x})
    assert y.shape == (0, 4, 3, 3) and y.dtype == np.float32
