"""The native depthwise conv (csrc/depthwise.c through providers/cpu/kernels/depthwise_native.py): onnxruntime's
numbers over a sweep of geometries (channel counts around the vector width, kernels, strides, dilations,
asymmetric padding, batches, maps smaller than the kernel's reach), with its bias and each activation it applies
in C; inputs in NCHW and channels-last memory; the dtypes it leaves to numpy; NaN kept; its rows shared with a
helper thread; and EPCTX_NATIVE=0 turning it off."""

from __future__ import annotations

import math
import os
import shutil
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from epctx.providers.cpu import fusion, native
from epctx.providers.cpu.kernels import conv as conv_kernels
from epctx.providers.cpu.kernels import depthwise_native
from epctx.providers.cpu.kernels.conv_weights import prepare_weight
from epctx.providers.cpu.kernels.depthwise import DepthwiseChannelsLast
from epctx.providers.cpu.kernels.depthwise_native import DepthwiseNative
from tests.oracle import assert_matches_ort, run_epctx

RNG = np.random.default_rng(2611)

needs_native = pytest.mark.skipif(native.kernels() is None, reason="the native kernels are not built here")

ACTIVATIONS: dict[str, list[onnx.NodeProto]] = {
    "none": [],
    "relu": [helper.make_node("Relu", ["y"], ["z"])],
    "relu6": [helper.make_node("Clip", ["y", "lo", "hi"], ["z"])],
    "min_only": [helper.make_node("Clip", ["y", "lo"], ["z"])],
    "hardswish": [helper.make_node("HardSwish", ["y"], ["z"])],
    "hardsigmoid": [helper.make_node("HardSigmoid", ["y"], ["z"], alpha=0.3, beta=0.4)],
    "silu": [helper.make_node("Sigmoid", ["y"], ["s"]), helper.make_node("Mul", ["y", "s"], ["z"])],
}


def conv_model(
    x_shape: tuple[int, ...], w: np.ndarray, b: np.ndarray | None, activation: str, **attrs: Any
) -> bytes:
    """A Conv of ``x`` (``x_shape``, the weights' dtype) with the constant ``w`` and ``b``, then ``activation``
    (of ``ACTIVATIONS``), its output ``z``."""
    dtype = w.dtype
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(0.0, dtype), "lo")]
    inits.append(numpy_helper.from_array(np.array(6.0, dtype), "hi"))
    inputs = ["x", "w"]
    if b is not None:
        inits.append(numpy_helper.from_array(b, "b"))
        inputs.append("b")
    tail = ACTIVATIONS[activation]
    nodes = [helper.make_node("Conv", inputs, ["y" if tail else "z"], **attrs), *tail]
    elem = onnx.helper.np_dtype_to_tensor_dtype(dtype)
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", elem, list(x_shape))],
        [helper.make_tensor_value_info("z", elem, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _model(
    x_shape: tuple[int, ...],
    kernel: tuple[int, int],
    activation: str,
    *,
    bias: bool = True,
    dtype: Any = np.float32,
    **attrs: Any,
) -> bytes:
    c = x_shape[1]
    w = (RNG.standard_normal((c, 1, *kernel)) * 0.5).astype(dtype)
    b = RNG.standard_normal(c).astype(dtype) if bias else None
    return conv_model(x_shape, w, b, activation, group=c, **attrs)


def _cases(count: int) -> list[tuple[Any, ...]]:
    """Seeded random geometries: (x shape, kernel, strides, dilations, pads)."""
    rng = np.random.default_rng(7)
    cases = []
    while len(cases) < count:
        c = int(rng.choice([1, 3, 15, 16, 17, 40, 64, 72, 130]))
        kernel = tuple(int(k) for k in rng.choice([1, 2, 3, 5], size=2))
        strides = tuple(int(s) for s in rng.choice([1, 1, 2, 3], size=2))
        dilations = tuple(int(d) for d in rng.choice([1, 1, 2], size=2))
        pads = [int(rng.integers(0, k)) for k in kernel * 2]
        size = tuple(int(s) for s in rng.integers(1, 24, size=2))
        reach = [d * (k - 1) + 1 for d, k in zip(dilations, kernel)]
        if any(s + pads[i] + pads[i + 2] < r for i, (s, r) in enumerate(zip(size, reach))):
            continue
        cases.append(((int(rng.choice([1, 2])), c, *size), kernel, strides, dilations, pads))
    return cases


@pytest.mark.skipif(
    shutil.which("cc") is None, reason="no C compiler: the package installs without its kernels"
)
@pytest.mark.skipif(
    os.environ.get("EPCTX_NATIVE", "1").strip() == "0", reason="EPCTX_NATIVE=0 turns them off"
)
def test_kernels_are_built_where_a_compiler_is() -> None:
    """pip install built csrc/ (setup.py): an optional extension must not go missing unnoticed."""
    assert native.kernels() is not None


@needs_native
@pytest.mark.parametrize(("x_shape", "kernel", "strides", "dilations", "pads"), _cases(48))
def test_geometries_match_onnxruntime(
    x_shape: tuple[int, ...],
    kernel: tuple[int, int],
    strides: tuple[int, int],
    dilations: tuple[int, int],
    pads: list[int],
) -> None:
    activation = list(ACTIVATIONS)[sum(x_shape + kernel) % len(ACTIVATIONS)]
    model = _model(x_shape, kernel, activation, strides=strides, dilations=dilations, pads=pads)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    assert_matches_ort(model, {"x": x}, atol=1e-5, rtol=1e-5)


@needs_native
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("bias", [True, False])
def test_activations_and_bias(activation: str, bias: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each activation on a MobileNet-sized map (inner columns four at a time, then the borders), in C where it
    has a native form."""
    forms: list[Any] = []
    real = fusion.native_form
    monkeypatch.setattr(fusion, "native_form", lambda a: forms.append(real(a)) or forms[-1])
    model = _model((1, 40, 28, 28), (3, 3), activation, bias=bias, pads=[1, 1, 1, 1])
    x = (RNG.standard_normal((1, 40, 28, 28)) * 4).astype(np.float32)
    assert_matches_ort(model, {"x": x}, atol=1e-5, rtol=1e-5)
    if activation != "none":
        assert forms and forms[0] is not None  # applied in C


@needs_native
@pytest.mark.parametrize("activation", ["hardswish", "silu"])
def test_an_activation_without_native_form_runs_after(
    activation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An epilogue activation the C loop has no form of: numpy applies it to the result."""
    monkeypatch.setattr(fusion, "native_form", lambda a: None)
    model = _model((1, 40, 28, 28), (3, 3), activation, pads=[1, 1, 1, 1])
    x = (RNG.standard_normal((1, 40, 28, 28)) * 4).astype(np.float32)
    assert_matches_ort(model, {"x": x}, atol=1e-5, rtol=1e-5)


@needs_native
def test_silu_over_the_float_range() -> None:
    """The C loop's SiLU (a polynomial exp) on values from -100 to 100, infinities and NaN among them: within 1e-6
    of float64's x * sigmoid(x) relative (onnxruntime's own SiLU is off by up to 1.6e-6 absolute near -17);
    NaN where onnxruntime has NaN (the specials and their neighbours: 0 * inf in the conv's sum). A 3x3 conv whose only weight is its centre's 1, so that the
    conv passes x on and the direct loop applies the SiLU."""
    values = np.concatenate(
        [np.linspace(-100, 100, 4000), [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-30, -88.5]]
    )
    x = values.astype(np.float32).reshape(1, 1, 1, -1)
    w = np.zeros((1, 1, 3, 3), np.float32)
    w[0, 0, 1, 1] = 1
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]), *ACTIVATIONS["silu"]]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    (z,) = assert_matches_ort(model, {"x": x}, atol=2e-6, rtol=2e-6)
    line = x[0, 0, 0, :3999].astype(np.float64)  # the linspace, clear of its neighbour inf's products
    exact = line / (1 + np.exp(-line))
    big = np.abs(exact) > 1e-30
    np.testing.assert_allclose(z[0, 0, 0, :3999][big], exact[big], rtol=1e-6)


@needs_native
def test_nan_stays_nan() -> None:
    model = _model((1, 16, 6, 6), (3, 3), "relu", pads=[1, 1, 1, 1])
    x = RNG.standard_normal((1, 16, 6, 6)).astype(np.float32)
    x[0, 3, 2, 2] = np.nan
    (z,) = assert_matches_ort(model, {"x": x})
    assert np.isnan(z[0, 3, 1:4, 1:4]).all() and np.isnan(z).sum() == 9


@needs_native
def test_float64_runs_numpy_form() -> None:
    """float64 (which onnxruntime's Conv lacks): the numpy form, then the bias and the activation."""
    model = onnx.load_from_string(_model((1, 24, 9, 9), (3, 3), "relu6", dtype=np.float64, pads=[1, 1, 1, 1]))
    x = RNG.standard_normal((1, 24, 9, 9))
    (z,) = run_epctx(model, {"x": x})
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    windows = np.lib.stride_tricks.sliding_window_view(
        np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), (2, 3)
    )
    y = np.einsum("nchwpq,cpq->nchw", windows, inits["w"][:, 0]) + inits["b"][:, None, None]
    assert z.dtype == np.float64
    np.testing.assert_allclose(z, np.clip(y, 0, 6), rtol=1e-12, atol=1e-12)


def _plan(
    x_shape: tuple[int, ...], kernel: tuple[int, int], pads: list[int], strides: tuple[int, int]
) -> Any:
    geo = conv_kernels.spatial_geometry(x_shape[2:], kernel, strides, (1, 1), pads, "NOTSET")
    return conv_kernels._ConvPlan(x_shape, (x_shape[1], 1, *kernel), geo, x_shape[1])


@needs_native
@pytest.mark.parametrize(
    ("x_shape", "kernel", "pads", "strides"),
    [
        ((1, 16, 112, 112), (3, 3), [1, 1, 1, 1], (1, 1)),
        ((2, 72, 30, 28), (3, 3), [1, 1, 1, 1], (2, 2)),
        ((1, 240, 14, 14), (5, 5), [2, 2, 2, 2], (1, 1)),
        ((1, 33, 9, 11), (5, 3), [0, 2, 1, 0], (1, 3)),
    ],
)
def test_channels_last_input_read_in_place(
    x_shape: tuple[int, ...], kernel: tuple[int, int], pads: list[int], strides: tuple[int, int]
) -> None:
    """An input in channels-last memory (a value handed over, layout.py) is read where it lies; NCHW memory
    through one transposed copy; both give numpy's einsum form's numbers."""
    plan = _plan(x_shape, kernel, pads, strides)
    assert isinstance(plan.channels_last, DepthwiseNative)
    w = RNG.standard_normal((x_shape[1], 1, *kernel)).astype(np.float32)
    prep = prepare_weight(w, x_shape[1])
    x = RNG.standard_normal(x_shape).astype(np.float32)
    last = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    expected = DepthwiseChannelsLast(x_shape, w.shape, plan.geo).run_channels_last(x, prep)
    for given in (x, last):
        np.testing.assert_allclose(plan.channels_last.run_channels_last(given, prep), expected, atol=1e-5)
    np.testing.assert_allclose(plan.channels_last.run(x, prep), expected.transpose(0, 3, 1, 2), atol=1e-5)


@needs_native
@pytest.mark.parametrize("x_shape", [(1, 16, 64, 64), (3, 8, 50, 50), (1, 640, 10, 10)])
def test_rows_shared_by_the_pool(x_shape: tuple[int, ...], native_shares: list[int]) -> None:
    """A conv of >= _SHARED_MACS multiply-adds: its rows (across the batch's images) shared by csrc/pool.c's
    workers; a smaller one on the calling thread alone."""
    for shape in (x_shape, (1, 8, 6, 6)):
        native_shares.clear()
        model = _model(shape, (3, 3), "relu", pads=[1, 1, 1, 1])
        x = RNG.standard_normal(shape).astype(np.float32)
        assert_matches_ort(model, {"x": x}, atol=1e-5, rtol=1e-5)
        shares = math.prod(shape) * 9 >= depthwise_native._SHARED_MACS
        assert native_shares == [2 if shares else 1], shape
        assert shares == (shape == x_shape)


def test_off_switch(numpy_kernels: None) -> None:
    """EPCTX_NATIVE=0: no native kernels; depthwise convs take the numpy forms."""
    assert native.kernels() is None
    plan = _plan((1, 64, 20, 20), (3, 3), [1, 1, 1, 1], (1, 1))
    assert isinstance(plan.channels_last, DepthwiseChannelsLast)
    model = _model((1, 64, 20, 20), (3, 3), "hardswish", pads=[1, 1, 1, 1])
    assert_matches_ort(model, {"x": RNG.standard_normal((1, 64, 20, 20)).astype(np.float32)}, atol=1e-5)
