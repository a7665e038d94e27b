"""numpy's OpenBLAS GEMM with a beta (``providers/cpu/cblas.py``): the product added to what the output holds,
on strided operands as the flat GEMM passes them, against numpy; the flat GEMM summing its kernel offsets with
it, equal to numpy's form (the temporary and the add) and to onnxruntime; a 1x1 conv's product added to its bias
written first."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from epctx.providers.cpu.cblas import gemm_for
from epctx.providers.cpu.kernels import conv_flat
from tests.oracle import run_ort

RNG = np.random.default_rng(8)


def _gemm(dtype: Any) -> Any:
    gemm = gemm_for(np.dtype(dtype))
    if gemm is None:
        pytest.skip("numpy's BLAS is not an OpenBLAS with cblas symbols")
    return gemm


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_the_product_is_added_to_the_output_with_strided_operands(dtype: Any, beta: float) -> None:
    gemm = _gemm(dtype)
    a = RNG.standard_normal((5, 7)).astype(dtype)
    wide = RNG.standard_normal((7, 40)).astype(dtype)  # b: columns 3..19 of it, its row stride 40
    c = RNG.standard_normal((5, 30)).astype(dtype)  # c: columns 4..20 of it, its row stride 30
    expected = c.copy()
    expected[:, 4:20] = a @ wide[:, 3:19] + beta * c[:, 4:20]
    item = c.itemsize
    gemm(5, 16, 7, a.ctypes.data, 7, wide.ctypes.data + 3 * item, 40, beta, c.ctypes.data + 4 * item, 30)
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(c, expected, rtol=tolerance, atol=tolerance)


def test_no_gemm_for_other_dtypes() -> None:
    assert gemm_for(np.dtype(np.float16)) is None and gemm_for(np.dtype(np.int32)) is None


def _conv_model(c: int, size: int) -> bytes:
    w = numpy_helper.from_array((RNG.standard_normal((c, c, 3, 3)) * 0.2).astype(np.float32), "w")
    b = numpy_helper.from_array(RNG.standard_normal(c).astype(np.float32), "b")
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [node],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, c, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model.SerializeToString()


def test_the_flat_gemm_sums_its_offsets_in_the_gemm_and_equals_numpys_form(
    monkeypatch: pytest.MonkeyPatch,
    numpy_kernels: None,
) -> None:
    _gemm(np.float32)
    model = _conv_model(16, 20)  # stride 1, M <= C, a map wide enough: a flat GEMM, two images
    x = {"x": RNG.standard_normal((2, 16, 20, 20)).astype(np.float32)}
    added, summed = conv_flat.FlatGemm._added, conv_flat.FlatGemm._summed
    calls: list[str] = []
    monkeypatch.setattr(conv_flat.FlatGemm, "_added", lambda *a: (calls.append("added"), added(*a))[1])
    monkeypatch.setattr(conv_flat.FlatGemm, "_summed", lambda *a: (calls.append("summed"), summed(*a))[1])
    with_gemm = epctx.InferenceSession(model).run(None, x)[0]
    monkeypatch.setattr(conv_flat, "gemm_for", lambda dtype: None)
    without = epctx.InferenceSession(model).run(None, x)[0]
    assert calls == ["summed", "added"]
    # the same terms in the same order (equal to the bit here; a BLAS kernel may round the last add otherwise)
    np.testing.assert_allclose(with_gemm, without, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(with_gemm, run_ort(model, x)[0], rtol=1e-4, atol=1e-4)


def _depthwise_pointwise_depthwise() -> bytes:
    """x[1, 16, 64, 64] -> 3x3 depthwise -> 1x1 conv to 32 (bias) -> HardSwish -> 3x3 depthwise -> y: the first
    conv hands its result over channels-last, which the 1x1 conv reads as a row-major (pixels, C) matrix and
    multiplies by W^T (``conv.pointwise_last``), handing its own result over to the last conv."""
    w0 = numpy_helper.from_array((RNG.standard_normal((16, 1, 3, 3)) * 0.3).astype(np.float32), "w0")
    w1 = numpy_helper.from_array((RNG.standard_normal((32, 16, 1, 1)) * 0.3).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(RNG.standard_normal(32).astype(np.float32), "b1")
    w2 = numpy_helper.from_array((RNG.standard_normal((32, 1, 3, 3)) * 0.3).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["d"], group=16, pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["d", "w1", "b1"], ["p"]),
        helper.make_node("HardSwish", ["p"], ["h"]),
        helper.make_node("Conv", ["h", "w2"], ["y"], group=32, pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "dpd",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w0, w1, b1, w2],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8
    ).SerializeToString()


def test_a_pointwise_convs_bias_is_written_under_its_product(
    monkeypatch: pytest.MonkeyPatch, numpy_kernels: None
) -> None:
    """The bias filled into the output and the product added by the GEMM (beta 1), equal to the product then the
    bias added (no cblas GEMM) and to onnxruntime."""
    from epctx.providers.cpu.kernels import conv_pointwise

    gemm = _gemm(np.float32)
    model = _depthwise_pointwise_depthwise()
    x = {"x": RNG.standard_normal((1, 16, 64, 64)).astype(np.float32)}
    betas: list[float] = []

    def counted(*args: Any) -> None:
        betas.append(args[7])
        gemm(*args)

    monkeypatch.setattr(conv_pointwise, "gemm_for", lambda dtype: counted)
    session = epctx.InferenceSession(model)
    with_gemm = [session.run(None, x)[0] for _ in range(2)]
    assert betas == [1.0, 1.0]  # the 1x1 conv's product added to its bias, at each run
    monkeypatch.setattr(conv_pointwise, "gemm_for", lambda dtype: None)
    without = epctx.InferenceSession(model).run(None, x)[0]
    expected = run_ort(model, x)[0]
    for got in (*with_gemm, without):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(with_gemm[0], without, rtol=1e-5, atol=1e-5)
