"""Large convs shared with a helper thread in bands (providers/cpu/parallel.py): one band per runner, each
building its columns, multiplying and applying the epilogue's activation; NCHW and channels-last results, a
strided conv's phase split and the window view, uneven bands, a product of few columns split by rows. Each
case checks that the work was shared (jobs of two blocks) and that the numbers are onnxruntime's."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import epctx
from tests.cpu.test_conv_fewer_passes import SILU
from tests.cpu.test_conv_fewer_passes import _model as _conv_model
from tests.oracle import run_ort

RNG = np.random.default_rng(2611)


def _conv(
    name: str, x: str, y: str, w_shape: tuple[int, ...], inits: list[Any], **attrs: Any
) -> onnx.NodeProto:
    w = (RNG.standard_normal(w_shape) * 0.2).astype(np.float32)
    b = RNG.standard_normal(w_shape[0]).astype(np.float32)
    inits += [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]
    return helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [y], name=name, **attrs)


def _silu(y: str, z: str) -> list[onnx.NodeProto]:
    return [helper.make_node("Sigmoid", [y], [f"{y}_s"]), helper.make_node("Mul", [y, f"{y}_s"], [z])]


def _model(x_shape: tuple[int, ...], nodes: list[onnx.NodeProto], inits: list[Any]) -> bytes:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _dense(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], tail: list[onnx.NodeProto], **attrs: Any
) -> bytes:
    return _conv_model(x_shape, w_shape, tail, w_scale=0.2, **attrs)


RELU = [helper.make_node("Relu", ["y"], ["z"])]


def _handing(x_shape: tuple[int, ...], w_shape: tuple[int, ...], **attrs: Any) -> bytes:
    """A dense conv (+ SiLU) handing its result channels-last to a depthwise conv."""
    inits: list[Any] = []
    m = w_shape[0]
    nodes = [
        _conv("dense", "x", "y", w_shape, inits, **attrs),
        *_silu("y", "a"),
        _conv("dw", "a", "z", (m, 1, 3, 3), inits, group=m, pads=[1] * 4),
    ]
    return _model(x_shape, nodes, inits)


def _pointwise(x_shape: tuple[int, ...], m: int) -> bytes:
    """depthwise -> a large 1x1 conv (+ Relu) reading channels-last memory -> depthwise."""
    inits: list[Any] = []
    c = x_shape[1]
    nodes = [
        _conv("dw0", "x", "a", (c, 1, 3, 3), inits, group=c, pads=[1] * 4),
        _conv("pw", "a", "p", (m, c, 1, 1), inits),
        helper.make_node("Relu", ["p"], ["r"]),
        _conv("dw1", "r", "z", (m, 1, 3, 3), inits, group=m, pads=[1] * 4),
    ]
    return _model(x_shape, nodes, inits)


CASES = {  # name: (model, input shape, convs shared in bands)
    "strided-phases-silu": lambda: (_dense((1, 16, 192, 192), (32, 16, 3, 3), SILU, strides=[2, 2], pads=[1] * 4), (1, 16, 192, 192), 1),
    "window-view-relu": lambda: (_dense((1, 16, 64, 64), (64, 16, 3, 3), RELU, pads=[1] * 4), (1, 16, 64, 64), 1),
    "uneven-bands": lambda: (_dense((1, 8, 75, 75), (96, 8, 3, 3), SILU, pads=[1] * 4), (1, 8, 75, 75), 1),
    "one-dimensional": lambda: (_dense((1, 64, 2048), (128, 64, 5), RELU, pads=[2, 2]), (1, 64, 2048), 1),
    "few-columns-rows-split": lambda: (_dense((1, 256, 7, 7), (512, 256, 3, 3), RELU, pads=[1] * 4), (1, 256, 7, 7), 1),
    "channels-last-im2col": lambda: (_handing((1, 16, 192, 192), (64, 16, 3, 3), strides=[2, 2], pads=[1] * 4), (1, 16, 192, 192), 2),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_large_convs_shared_in_bands_match_onnxruntime(
    case: str, shared_jobs: list[int], numpy_kernels: None
) -> None:
    data, x_shape, shared = CASES[case]()
    x = RNG.standard_normal(x_shape).astype(np.float32)
    sess = epctx.InferenceSession(data)
    expected = run_ort(data, {"x": x})[0]
    for _ in range(2):  # the first call makes the route, the second takes the kept one
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], expected, atol=2e-4, rtol=1e-4)
    assert shared_jobs == [2] * (2 * shared)  # each shared conv in two bands, at each run


def test_a_product_under_share_macs_is_one_call_on_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GEMM too small to pay for waking a helper is not split (parallel.SHARE_MACS)."""
    from epctx.providers.cpu import blas_serial, parallel

    monkeypatch.setattr(blas_serial.serial(), "threads", lambda: 2)
    monkeypatch.setattr(parallel, "_run", lambda *a: pytest.fail("a small product was split"))
    a = RNG.standard_normal((64, 256)).astype(np.float32)
    b = RNG.standard_normal((256, 1024)).astype(np.float32)  # 16.8M multiply-adds
    out = np.empty((64, 1024), np.float32)
    parallel.matmul_columns(a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-3)


def test_a_large_channels_last_pointwise_conv_is_one_call_with_its_epilogue(
    monkeypatch: pytest.MonkeyPatch, shared_jobs: list[int], numpy_kernels: None
) -> None:
    """A 1x1 conv reading channels-last memory: one GEMM on OpenBLAS's own threads (not bands: faster here),
    its bias written under the product and its Relu applied in the same call; onnxruntime's numbers."""
    from epctx.providers.cpu.kernels import conv

    made: list[Any] = []
    original = conv.pointwise_last

    def spied(*args: Any) -> Any:
        made.append(args[4])  # the activation handed to it
        return original(*args)

    monkeypatch.setattr(conv, "pointwise_last", spied)
    data = _pointwise((1, 128, 64, 64), 128)
    x = RNG.standard_normal((1, 128, 64, 64)).astype(np.float32)
    sess = epctx.InferenceSession(data)
    expected = run_ort(data, {"x": x})[0]
    for _ in range(2):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], expected, atol=2e-4, rtol=1e-4)
    assert made and all(fn is not None for fn in made)  # the Relu went with the product
    assert (
        shared_jobs == [2] * 4
    )  # the two depthwise convs shared their rows, twice each; the 1x1 conv did not


def test_a_shared_depthwise_conv_is_not_run_under_the_one_thread_gate() -> None:
    """A channels-last depthwise conv shares its rows itself: run under the one-thread BLAS gate, its
    ``split_ranges`` saw one runner and never shared (the gate sets OpenBLAS's count to 1 for the call)."""
    from epctx.providers.cpu.kernels.conv import _ConvPlan
    from epctx.providers.cpu.kernels.conv_direct import gate_of
    from epctx.providers.cpu.kernels.windows import spatial_geometry

    geo = spatial_geometry((112, 112), [3, 3], [1, 1], [1, 1], [1] * 4, "NOTSET", ceil_mode=False, node="dw")
    plan = _ConvPlan((1, 64, 112, 112), (64, 1, 3, 3), geo, 64)
    assert plan.channels_last is not None and plan.channels_last.shares
    assert gate_of(plan) is None
