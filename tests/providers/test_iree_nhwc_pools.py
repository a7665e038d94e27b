"""Global average pools over channels-last data (``epctx.providers.iree.nhwc_pools``, in IREE jobs compiled
channels-last): the rewritten graph computes what the pool did (opset 17's ReduceMean with its axes an attribute,
18's with an input), checked with onnxruntime on both graphs; pools over other ranks are left alone. The rule
(which jobs rewrite) and IREE running it on a real squeeze-and-excitation net are
tests/providers/test_iree_data_tiling.py's; speed (MobileNetV3 4.18 -> 3.02 ms) is in the module's docstring."""

from __future__ import annotations

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
