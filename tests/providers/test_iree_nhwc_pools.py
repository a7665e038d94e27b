"""Global average pools and max pools over channels-last data (``epctx.providers.iree.nhwc_pools``, in IREE jobs
compiled channels-last): the rewritten graph computes what the pool did (opset 17's ReduceMean with its axes an
attribute, 18's with an input; max pools of ResNet's 3x3 / 2 and YOLO's SPPF 5x5 / 1 among others, over negative
values so that the padding must not win), checked with onnxruntime on both graphs; pools over other ranks, and max
pools the rewrite does not express (ceil mode, dilations, indices, auto padding, unknown sizes; a dynamic batch,
whose nets IREE compiles another way: tests/providers/test_iree_data_tiling.py), are left alone. The rule
(which jobs rewrite) and IREE running it on a real squeeze-and-excitation net are
tests/providers/test_iree_data_tiling.py's; speed (MobileNetV3 4.18 -> 3.02 ms) is in the module's docstring."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from epctx.providers.iree.nhwc_pools import global_pools_channels_last
from tests.oracle import run_ort


def _se_block(shape: list[int | str], opset: int) -> onnx.ModelProto:
    """x -> HardSwish -> GlobalAveragePool -> HardSigmoid -> Mul(HardSwish's output, it): a squeeze-and-excitation
    block's shape, without its two 1x1 convolutions."""
    nodes = [
        helper.make_node("HardSwish", ["x"], ["h"]),
        helper.make_node("GlobalAveragePool", ["h"], ["p"], name="pool"),
        helper.make_node("HardSigmoid", ["p"], ["s"]),
        helper.make_node("Mul", ["h", "s"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    graph = helper.make_graph(nodes, "se", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("shape", [[1, 24, 7, 9], ["n", 24, 7, 9]], ids=["static", "dynamic batch"])
def test_the_rewritten_pool_computes_what_the_pool_did(opset: int, shape: list[int | str]) -> None:
    model = _se_block(shape, opset)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert global_pools_channels_last(rewritten) == 1
    onnx.checker.check_model(rewritten)
    ops = [n.op_type for n in rewritten.graph.node]
    assert "GlobalAveragePool" not in ops and ops.count("ReduceMean") == 1 and ops.count("Transpose") == 1
    x = np.random.default_rng(0).standard_normal((2, 24, 7, 9)).astype(np.float32)
    if shape[0] == 1:
        x = x[:1]
    (expected,) = run_ort(model, {"x": x})
    (got,) = run_ort(rewritten, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [[1, 24, 9], [1, 8, 3, 5, 5], [1, 24, "h", "w"]])
def test_pools_over_other_ranks_are_left_alone(shape: list[int | str]) -> None:
    if len(shape) == 4:  # known rank 4 with unknown sizes: rewritten (only the rank matters)
        assert global_pools_channels_last(_se_block(shape, 17)) == 1
        return
    model = _se_block(shape, 17)
    before = model.SerializeToString()
    assert global_pools_channels_last(model) == 0
    assert model.SerializeToString() == before


def test_a_paddle_style_job_with_depthwise_filters_and_pools_loads_in_the_worker(tmp_path: Path) -> None:
    """Paddle exports every weight as a Constant node with its shape recorded (value_info): the pools' rewrite
    infers shapes, so it runs before the depthwise filters are stored transposed (PP-OCRv4 rec failed to import
    so: 'Inferred shape and existing shape differ'). The worker's whole rewrite, without IREE."""
    from epctx.providers.iree.worker import _load

    rng = np.random.default_rng(2)
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 1, 3, 3], rng.standard_normal(72).astype(np.float32))
    nodes = [
        helper.make_node("Constant", [], ["w"], value=w),
        helper.make_node("Conv", ["x", "w"], ["c"], group=8, pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c"], ["p"]),
        helper.make_node("Mul", ["c", "p"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])
    recorded = [helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 1, 3, 3])]
    graph = helper.make_graph(nodes, "paddle_style", [x], [y], value_info=recorded)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "model.onnx")
    job = {"min_opset": 17, "prelayout": True, "depthwise": True, "nhwc_pools": True}
    loaded, transposed = _load(tmp_path, job)
    ops = [n.op_type for n in loaded.graph.node]
    assert "GlobalAveragePool" not in ops and "Conv" not in ops and transposed == {"w": [2, 3, 1, 0]}
    feed = {"x": rng.standard_normal((1, 8, 6, 6)).astype(np.float32)}
    np.testing.assert_allclose(run_ort(loaded, feed)[0], run_ort(model, feed)[0], rtol=1e-5, atol=1e-5)


def _max_pool(
    shape: list[int | str],
    opset: int = 17,
    outputs: int = 1,
    dtype: int = TensorProto.FLOAT,
    **attributes: object,
) -> onnx.ModelProto:
    """x -> Neg -> MaxPool -> Neg: the pool between element-wise ops, as between a stem and a block."""
    names = ["p", "i"][:outputs]
    nodes = [
        helper.make_node("Neg", ["x"], ["h"]),
        helper.make_node("MaxPool", ["h"], names, name="pool", **attributes),
        helper.make_node("Neg", ["p"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", dtype, shape)
    y = helper.make_tensor_value_info("y", dtype, ["n", "c", "ho", "wo"][: len(shape)])
    graph = helper.make_graph(nodes, "pool", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize(
    "attributes",
    [
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},  # ResNet's, after its stem
        {"kernel_shape": [5, 5], "strides": [1, 1], "pads": [2, 2, 2, 2]},  # YOLO's SPPF
        {"kernel_shape": [2, 2], "strides": [2, 2]},
        {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [0, 1, 2, 0]},
        {"kernel_shape": [3, 3]},
        {
            "kernel_shape": [9, 9],
            "strides": [1, 1],
            "pads": [4, 4, 4, 4],
        },  # a YOLOX's SPP: rows, then columns
        {"kernel_shape": [13, 13], "strides": [1, 1], "pads": [6, 6, 6, 6]},
        {"kernel_shape": [7, 9], "strides": [2, 3], "pads": [3, 1, 2, 4]},
    ],
    ids=["3x3/2", "5x5/1", "2x2/2", "uneven", "3x3/1 unpadded", "9x9/1", "13x13/1", "7x9/2x3"],
)
@pytest.mark.parametrize("opset", [12, 17])
@pytest.mark.parametrize("batch", [1, 2])
def test_the_rewritten_max_pool_computes_what_the_pool_did(
    attributes: dict[str, list[int]], opset: int, batch: int
) -> None:
    model = _max_pool([batch, 16, 11, 13], opset, **attributes)  # type: ignore[arg-type]
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert global_pools_channels_last(rewritten) == 1
    onnx.checker.check_model(rewritten, full_check=True)
    ops = [n.op_type for n in rewritten.graph.node]
    kh, kw = attributes["kernel_shape"]
    taps = kh * kw if kh * kw <= 49 else kh + kw  # past 49 taps: the rows' maximum, then the columns'
    assert "MaxPool" not in ops and ops.count("Transpose") == 2 and ops.count("Slice") == taps
    x = np.random.default_rng(1).standard_normal((batch, 16, 11, 13)).astype(np.float32) + 3
    (expected,) = run_ort(model, {"x": x})
    (got,) = run_ort(rewritten, {"x": x})
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    ("shape", "outputs", "attributes"),
    [
        ([1, 16, 11, 13], 1, {"kernel_shape": [3, 3], "ceil_mode": 1}),
        ([1, 16, 11, 13], 1, {"kernel_shape": [3, 3], "dilations": [2, 2]}),
        ([1, 16, 11, 13], 2, {"kernel_shape": [3, 3]}),
        ([1, 16, 11, 13], 1, {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"}),
        ([1, 16, "h", "w"], 1, {"kernel_shape": [3, 3]}),
        (["n", 16, 11, 13], 1, {"kernel_shape": [3, 3]}),
        ([1, 16, 11], 1, {"kernel_shape": [3]}),
    ],
    ids=["ceil mode", "dilations", "indices", "auto pad", "unknown sizes", "dynamic batch", "1-D"],
)
def test_max_pools_the_rewrite_does_not_express_are_left_alone(
    shape: list[int | str], outputs: int, attributes: dict[str, object]
) -> None:
    model = _max_pool(shape, outputs=outputs, **attributes)
    before = model.SerializeToString()
    assert global_pools_channels_last(model) == 0
    assert model.SerializeToString() == before


def test_a_half_precision_max_pool_is_padded_with_its_own_minus_infinity() -> None:
    model = _max_pool(
        [1, 8, 9, 9], dtype=TensorProto.FLOAT16, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]
    )
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert global_pools_channels_last(rewritten) == 1
    low = next(t for t in rewritten.graph.initializer if t.name.endswith("_low"))
    assert low.data_type == TensorProto.FLOAT16
    x = np.random.default_rng(3).standard_normal((1, 8, 9, 9)).astype(np.float16) + 3
    np.testing.assert_array_equal(run_ort(rewritten, {"x": x})[0], run_ort(model, {"x": x})[0])
