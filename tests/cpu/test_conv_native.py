"""The native direct conv (csrc/conv.c through providers/cpu/kernels/conv_native.py): onnxruntime's numbers over a
sweep of dense geometries (input channels from 1, output channels around the vector widths, kernels, strides,
dilations, asymmetric padding, batches, maps smaller than the kernel's reach) with each activation; its result
handed over channels-last to a depthwise conv; any input strides; its rows shared by the C pool; float64 and
EPCTX_NATIVE=0 taking the numpy forms; which convs it takes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from epctx.providers.cpu import fusion, layout, native
from epctx.providers.cpu.kernels import conv as conv_kernels
from epctx.providers.cpu.kernels import conv_native
from epctx.providers.cpu.kernels.conv_weights import prepare_weight
from tests.cpu.test_depthwise_native import ACTIVATIONS, conv_model
from tests.oracle import assert_matches_ort, run_epctx

RNG = np.random.default_rng(2612)

needs_native = pytest.mark.skipif(native.kernels() is None, reason="the native kernels are not built here")


def _model(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], activation: str, dtype: Any = np.float32, **attrs: Any
) -> bytes:
    w = (RNG.standard_normal(w_shape) / math.sqrt(math.prod(w_shape[1:]))).astype(dtype)
    return conv_model(x_shape, w, RNG.standard_normal(w_shape[0]).astype(dtype), activation, **attrs)


def _window_fits(size: Any, kernel: Any, dilations: Any, pads: list[int]) -> bool:
    """Whether the dilated window fits the padded input along each axis."""
    reach = [d * (k - 1) + 1 for d, k in zip(dilations, kernel)]
    return all(s + pads[i] + pads[i + 2] >= r for i, (s, r) in enumerate(zip(size, reach)))


def _cases(count: int) -> list[tuple[Any, ...]]:
    """Seeded random dense geometries the direct loop takes: (x shape, w shape, strides, dilations, pads)."""
    rng = np.random.default_rng(11)
    cases = []
    while len(cases) < count:
        c, m = int(rng.choice([1, 2, 3, 5, 16])), int(rng.choice([1, 7, 16, 17, 32, 33, 64]))
        kernel = tuple(int(k) for k in rng.choice([1, 2, 3, 5], size=2))
        if kernel == (1, 1):
            continue
        strides = tuple(int(s) for s in rng.choice([1, 1, 2, 3], size=2))
        dilations = tuple(int(d) for d in rng.choice([1, 1, 2], size=2))
        pads = [int(rng.integers(0, k)) for k in kernel * 2]
        size = tuple(int(s) for s in rng.integers(1, 26, size=2))
        if not _window_fits(size, kernel, dilations, pads):
            continue
        cases.append(((int(rng.choice([1, 2])), c, *size), (m, c, *kernel), strides, dilations, pads))
    return cases


def _deep_cases(count: int) -> list[tuple[Any, ...]]:
    """Seeded random geometries of a network's inner convs (tens to hundreds of input channels, more than one
    vector of output channels, rows wide enough for the 12- and 8-pixel tiles): (x shape, w shape, strides,
    dilations, pads)."""
    rng = np.random.default_rng(31)
    cases = []
    while len(cases) < count:
        c, m = int(rng.choice([8, 24, 64, 128])), int(rng.choice([17, 32, 33, 64, 96, 130]))
        k = int(rng.choice([1, 3, 3, 5]))
        strides = tuple(int(s) for s in rng.choice([1, 1, 2], size=2))
        dilations = (1, 1) if k == 1 else tuple(int(d) for d in rng.choice([1, 1, 2], size=2))
        pads = [0] * 4 if k == 1 else [int(rng.integers(0, k)) for _ in range(4)]
        size = (int(rng.integers(6, 30)), int(rng.integers(9, 42)))
        if not _window_fits(size, (k, k), dilations, pads):
            continue
        geo = conv_kernels.spatial_geometry(size, (k, k), strides, dilations, pads, "NOTSET")
        if not conv_native.direct_fits((1, c, *size), (m, c, k, k), geo, 1):
            continue
        cases.append(((1, c, *size), (m, c, k, k), strides, dilations, pads))
    return cases


@needs_native
@pytest.mark.parametrize(("x_shape", "w_shape", "strides", "dilations", "pads"), _cases(48) + _deep_cases(16))
def test_geometries_match_onnxruntime(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], strides: Any, dilations: Any, pads: list[int]
) -> None:
    """Each geometry from NCHW memory and from channels-last memory (read through its strides)."""
    geo = conv_kernels.spatial_geometry(x_shape[2:], w_shape[2:], strides, dilations, pads, "NOTSET")
    assert conv_native.direct_fits(x_shape, w_shape, geo, 1)
    activation = list(ACTIVATIONS)[sum(x_shape + w_shape) % len(ACTIVATIONS)]
    model = _model(x_shape, w_shape, activation, strides=strides, dilations=dilations, pads=pads)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    assert_matches_ort(model, {"x": x}, atol=3e-5, rtol=1e-5)
    channels_last = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    assert_matches_ort(model, {"x": channels_last}, atol=3e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(7,), (3, 5), (64, 9, 32), (0, 4)])
def test_filters_are_aligned_for_the_vectors(shape: tuple[int, ...]) -> None:
    """A filter or bias handed to the kernels starts on a 64-byte boundary (every vector load in one cache line),
    whatever numpy's allocation gave, with the values and dtype it had."""
    for offset in range(4):
        source = np.arange(math.prod(shape) + offset, dtype=np.float32)[offset:].reshape(shape)
        out = native.aligned(source)
        assert out.ctypes.data % native.ALIGNMENT == 0 or out.size == 0
        assert out.dtype == source.dtype and out.flags.c_contiguous
        np.testing.assert_array_equal(out, source)


@needs_native
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_network_convs_with_each_activation(activation: str) -> None:
    """A stem (3 -> 16, stride 2; eight pixels a step) and a 32 -> 48 conv (two passes of output channels)."""
    for x_shape, w_shape, strides in (
        ((1, 3, 64, 64), (16, 3, 3, 3), [2, 2]),
        ((1, 32, 20, 20), (48, 32, 3, 3), [1, 1]),
    ):
        model = _model(x_shape, w_shape, activation, strides=strides, pads=[1] * 4)
        x = (RNG.standard_normal(x_shape) * 3).astype(np.float32)
        assert_matches_ort(model, {"x": x}, atol=2e-5, rtol=1e-5)


@needs_native
def test_stem_hands_over_channels_last_to_a_depthwise_conv(monkeypatch: pytest.MonkeyPatch) -> None:
    """MobileNet's first two convs: the stem writes channels-last, the depthwise conv reads it where it lies."""
    inits = [
        numpy_helper.from_array((RNG.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32), "w0"),
        numpy_helper.from_array(RNG.standard_normal(16).astype(np.float32), "b0"),
        numpy_helper.from_array((RNG.standard_normal((16, 1, 3, 3)) * 0.3).astype(np.float32), "w1"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["y"], strides=[2, 2], pads=[1] * 4),
        helper.make_node("HardSwish", ["y"], ["a"]),
        helper.make_node("Conv", ["a", "w1"], ["z"], group=16, pads=[1] * 4),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 160, 160])],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    handing: list[bool] = []
    real = conv_native.DirectConv.route
    monkeypatch.setattr(
        conv_native.DirectConv, "route", lambda self, *a: handing.append(a[3]) or real(self, *a)
    )
    for _ in range(2):
        assert_matches_ort(model, {"x": RNG.standard_normal((1, 3, 160, 160)).astype(np.float32)}, atol=1e-5)
    assert handing == [True, True] and any(h.active() for h in layout.HANDOFFS.values())


@needs_native
def test_pointwise_reads_and_writes_channels_last(monkeypatch: pytest.MonkeyPatch) -> None:
    """dw -> 1x1 'proj' -> Add(residual) -> 1x1: the projection reads the depthwise conv's channels-last result
    in place and, its readers (the Add, a 1x1 conv) taking it, writes channels-last; where the Add's result is
    also a graph output, it writes NCHW."""
    c = 32
    inits = [
        numpy_helper.from_array((RNG.standard_normal((c, 1, 3, 3)) * 0.3).astype(np.float32), "dw_w"),
        numpy_helper.from_array((RNG.standard_normal((c, c, 1, 1)) * 0.2).astype(np.float32), "proj_w"),
        numpy_helper.from_array(RNG.standard_normal(c).astype(np.float32), "proj_b"),
        numpy_helper.from_array((RNG.standard_normal((24, c, 1, 1)) * 0.2).astype(np.float32), "next_w"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "dw_w"], ["d"], group=c, pads=[1] * 4),
        helper.make_node("Relu", ["d"], ["y"]),
        helper.make_node("Conv", ["y", "proj_w", "proj_b"], ["p"]),
        helper.make_node("Add", ["p", "x"], ["a"]),
        helper.make_node("Conv", ["a", "next_w"], ["z"]),
    ]
    handing: list[tuple[int, bool]] = []
    real = conv_native.DirectConv.route

    def spied(self: Any, *args: Any) -> Any:
        handing.append((self.w_shape[0], args[3]))
        return real(self, *args)

    monkeypatch.setattr(conv_native.DirectConv, "route", spied)
    for outputs in (["z"], ["z", "a"]):
        handing.clear()
        graph = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, c, 20, 24])],
            [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outputs],
            inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        assert_matches_ort(model, {"x": RNG.standard_normal((1, c, 20, 24)).astype(np.float32)}, atol=1e-5)
        assert handing == [(c, outputs == ["z"]), (24, False)]


@needs_native
def test_any_input_strides() -> None:
    """The C loop reads the input through its strides: a channels-last view and a sliced one give the numbers of
    a contiguous copy."""
    x_shape, w_shape = (1, 5, 21, 19), (24, 5, 3, 3)
    geo = conv_kernels.spatial_geometry(x_shape[2:], w_shape[2:], (2, 1), (1, 1), [1, 0, 2, 1], "NOTSET")
    direct = conv_native.DirectConv(x_shape, w_shape, geo, native.kernels())  # type: ignore[arg-type]
    prep = prepare_weight(RNG.standard_normal(w_shape).astype(np.float32), 1)
    bias = RNG.standard_normal((24, 1)).astype(np.float32)
    run = direct.route(
        prep, bias, fusion.activation_of(helper.make_node("Relu", ["a"], ["b"])), False, pytest.fail
    )
    x = RNG.standard_normal(x_shape).astype(np.float32)
    (expected,) = run(x)
    last = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    sliced = np.ascontiguousarray(np.pad(x, ((0, 0), (0, 3), (0, 0), (0, 4))))[:, :5, :, :19]
    for given in (last, sliced):
        np.testing.assert_allclose(run(given)[0], expected, rtol=1e-6, atol=1e-6)
    y = np.einsum(
        "nchwpq,mcpq->nmhw",
        _windows(np.pad(x, ((0, 0), (0, 0), (1, 2), (0, 1))), (3, 3), (2, 1)),
        prep["w2"].reshape(w_shape),
    )
    np.testing.assert_allclose(expected, np.maximum(y + bias.reshape(1, -1, 1, 1), 0), rtol=1e-5, atol=1e-5)


def _windows(x: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int]) -> np.ndarray:
    view = np.lib.stride_tricks.sliding_window_view(x, kernel, (2, 3))
    return view[:, :, :: strides[0], :: strides[1]]


@needs_native
@pytest.mark.parametrize("x_shape", [(1, 3, 96, 96), (2, 16, 30, 30)])
def test_rows_shared_by_the_pool(x_shape: tuple[int, ...], native_shares: list[int]) -> None:
    model = _model(x_shape, (32, x_shape[1], 3, 3), "relu6", pads=[1] * 4)
    assert_matches_ort(model, {"x": RNG.standard_normal(x_shape).astype(np.float32)}, atol=1e-5, rtol=1e-5)
    assert native_shares == [2]


@needs_native
def test_float64_takes_the_numpy_form() -> None:
    model = _model((1, 3, 12, 12), (8, 3, 3, 3), "relu", dtype=np.float64, pads=[1] * 4)
    x = RNG.standard_normal((1, 3, 12, 12))
    (z,) = run_epctx(model, {"x": x})
    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load_from_string(model).graph.initializer}
    y = np.einsum(
        "nchwpq,mcpq->nmhw", _windows(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), (1, 1)), inits["w"]
    )
    assert z.dtype == np.float64
    np.testing.assert_allclose(z, np.maximum(y + inits["b"].reshape(1, -1, 1, 1), 0), rtol=1e-12, atol=1e-12)


@needs_native
@pytest.mark.parametrize(
    ("x_shape", "w_shape", "direct"),
    [
        ((1, 3, 224, 224), (16, 3, 3, 3), True),  # a stem
        ((1, 64, 40, 40), (64, 64, 3, 3), True),  # 64 output channels
        ((1, 64, 40, 40), (128, 64, 3, 3), True),  # 576 values per output
        ((1, 128, 10, 10), (256, 128, 3, 3), True),  # 1152
        ((1, 256, 14, 14), (256, 256, 3, 3), False),  # deep and wide: BLAS's GEMM
        ((1, 256, 10, 10), (64, 256, 3, 3), True),  # deep, 64 output channels
        ((1, 512, 7, 7), (64, 512, 3, 3), False),  # deeper still: BLAS's GEMM
        ((1, 64, 40, 40), (128, 64, 1, 1), True),  # 1x1 of few input channels
        ((1, 384, 20, 20), (128, 384, 1, 1), True),
        ((1, 512, 7, 7), (512, 512, 1, 1), False),  # 1x1 of many: BLAS's GEMM
        ((1, 72, 1, 1), (24, 72, 1, 1), False),  # squeeze-excitation: the lean GEMM
        ((1, 16, 40), (16, 16, 3), False),  # 1-D
    ],
)
def test_which_convs_it_takes(x_shape: tuple[int, ...], w_shape: tuple[int, ...], direct: bool) -> None:
    nd = len(x_shape) - 2
    geo = conv_kernels.spatial_geometry(x_shape[2:], w_shape[2:], (1,) * nd, (1,) * nd, None, "NOTSET")
    plan = conv_kernels._ConvPlan(x_shape, w_shape, geo, 1)
    assert (plan.direct is not None) == direct
    if direct:
        assert plan.flat_gemm is None and plan.winograd is None


def test_off_switch(numpy_kernels: None) -> None:
    geo = conv_kernels.spatial_geometry((64, 64), (3, 3), (2, 2), (1, 1), [1] * 4, "NOTSET")
    assert conv_kernels._ConvPlan((1, 3, 64, 64), (16, 3, 3, 3), geo, 1).direct is None
    model = _model((1, 3, 64, 64), (16, 3, 3, 3), "hardswish", strides=[2, 2], pads=[1] * 4)
    assert_matches_ort(model, {"x": RNG.standard_normal((1, 3, 64, 64)).astype(np.float32)}, atol=1e-5)
