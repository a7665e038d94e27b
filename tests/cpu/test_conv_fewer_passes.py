"""Conv kernels that make fewer passes over their result (issue 21): SiLU on halved weights
(``kernels/conv_activations.py``), the bias of a dense NCHW im2col conv added in its GEMM (``im2col.im2col_gemm``)
and a bias added to channels-last memory over long tiled rows (``conv_direct.channels_last_bias``). Each is
checked against onnxruntime on the shapes, strides, pads and groups that take it, and on the cases that must
not take it."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import epctx
from epctx.providers.cpu import fusion
from epctx.providers.cpu.kernels import conv_activations, conv_direct
from tests.cpu.test_conv_epilogue import _weights
from tests.oracle import run_ort

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(2126)


def _array(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _model(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    tail: list[onnx.NodeProto],
    *,
    bias: bool = True,
    w_scale: float = 0.3,
    **attrs: Any,
) -> bytes:
    """x -> Conv(w[, b]) -> y, then ``tail`` (reading y, writing z); z the output."""
    names = ["x", "w", "b"] if bias else ["x", "w"]
    inits = [numpy_helper.from_array(_array(*w_shape, scale=w_scale), "w")]
    if bias:
        inits.append(numpy_helper.from_array(_array(w_shape[0]), "b"))
    graph = helper.make_graph(
        [helper.make_node("Conv", names, ["y"], name="conv", **attrs), *tail],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


SILU = [helper.make_node("Sigmoid", ["y"], ["s"]), helper.make_node("Mul", ["y", "s"], ["z"])]
SILU_SWAPPED = [helper.make_node("Sigmoid", ["y"], ["s"]), helper.make_node("Mul", ["s", "y"], ["z"])]
IDENTITY = [helper.make_node("Identity", ["y"], ["z"])]


def _check(data: bytes, x: np.ndarray, atol: float = 1e-4) -> Any:
    sess = epctx.InferenceSession(data)
    for _ in range(2):  # the first call makes the route, the second takes the kept one
        ours = sess.run(None, {"x": x})[0]
        theirs = run_ort(data, {"x": x})[0]
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
        np.testing.assert_allclose(ours, theirs, atol=atol, rtol=1e-4)
    return sess


# ------------------------------------------------------------------------------------------------- SiLU


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [
        ((1, 8, 9, 9), (16, 8, 3, 3), {"pads": [1] * 4}),  # im2col, one chunk
        ((1, 3, 96, 96), (16, 3, 3, 3), {"pads": [1] * 4, "strides": [2, 2]}),  # a stem: 36,864 values
        ((1, 8, 72, 72), (16, 8, 1, 1), {}),  # 82,944 values: two chunks, the last partial
        ((2, 16, 20, 20), (16, 16, 3, 3), {"pads": [1] * 4}),  # a batch of two
        ((1, 32, 14, 14), (32, 1, 5, 5), {"pads": [2] * 4, "group": 32}),  # depthwise
        ((1, 6, 50), (10, 6, 5), {"pads": [2, 2]}),  # 1-D
    ],
)
@pytest.mark.parametrize("tail", [SILU, SILU_SWAPPED], ids=["silu", "silu_swapped"])
def test_silu_runs_on_halved_weights_and_matches_onnxruntime(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any], tail: list[onnx.NodeProto]
) -> None:
    """Large inputs too (x * 6, weights 0.3: conv outputs of tens), where sigmoid saturates."""
    data = _model(x_shape, w_shape, tail, **attrs)
    sess = _check(data, _array(*x_shape, scale=6.0))
    (weights,) = _weights(sess)
    assert weights.settled()[2] is conv_activations.silu_halved


def test_silu_without_a_bias_is_halved_too() -> None:
    data = _model((1, 8, 12, 12), (16, 8, 3, 3), SILU, bias=False, pads=[1] * 4)
    sess = _check(data, _array(1, 8, 12, 12, scale=3.0))
    (weights,) = _weights(sess)
    assert weights.settled()[2] is conv_activations.silu_halved


def test_silu_with_a_bias_computed_at_run_time_keeps_the_plain_form() -> None:
    """A bias that is no constant cannot be halved once: the activation stays fusion's."""
    conv = helper.make_node("Conv", ["x", "w", "bb"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [helper.make_node("Neg", ["b"], ["bb"]), conv, *SILU],
        "g",
        [
            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 9, 9]),
            helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [16]),
        ],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(_array(16, 8, 3, 3, scale=0.3), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feed = {"x": _array(1, 8, 9, 9), "b": _array(16)}
    sess = epctx.InferenceSession(model.SerializeToString())
    np.testing.assert_allclose(sess.run(None, feed)[0], run_ort(model, feed)[0], atol=1e-5, rtol=1e-5)
    (weights,) = _weights(sess)
    assert weights.settled()[2] is not conv_activations.silu_halved


def test_relu_runs_as_clip_and_hard_swish_keeps_its_form() -> None:
    """Relu (unscaled) runs as the clip ufunc; HardSwish keeps fusion's prescaled form; Clip its own."""
    relu = _model((1, 8, 9, 9), (16, 8, 3, 3), [helper.make_node("Relu", ["y"], ["z"])], pads=[1] * 4)
    (weights,) = _weights(_check(relu, _array(1, 8, 9, 9)))
    assert weights.settled()[2] is conv_activations.relu
    big = _model((1, 16, 40, 40), (32, 16, 1, 1), [helper.make_node("Relu", ["y"], ["z"])])
    (weights,) = _weights(_check(big, _array(1, 16, 40, 40)))
    assert weights.settled()[2] is conv_activations.relu
    swish = _model((1, 8, 9, 9), (16, 8, 3, 3), [helper.make_node("HardSwish", ["y"], ["z"])], pads=[1] * 4)
    (weights,) = _weights(_check(swish, _array(1, 8, 9, 9)))
    assert weights.settled()[2] is fusion._hard_swish_scaled


@pytest.mark.parametrize("size", [7, 1 << 16, (1 << 16) + 5, 3 * (1 << 16)])
def test_silu_halved_against_float64_and_the_exp_form(size: int) -> None:
    """Against float64 y * sigmoid(y) on [-40, 40], and the special values as the exp form gives them."""
    y = np.linspace(-40, 40, size).astype(np.float32)
    y[:4] = [np.inf, -np.inf, np.nan, 0.0]
    u = y * np.float32(conv_activations.SILU_SCALE)
    plain = y.copy()
    with np.errstate(invalid="ignore"):  # -inf * 0 and nan, as the plan runs kernels
        conv_activations.silu_halved(u)
        fusion._silu(plain)
    np.testing.assert_array_equal(u[:4], plain[:4])  # inf, nan (-inf * 0), nan, 0
    y64 = y[4:].astype(np.float64)
    exact = y64 / (1 + np.exp(-y64))
    np.testing.assert_allclose(u[4:], exact, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_relu_as_clip_is_maximum(dtype: Any) -> None:
    y = np.linspace(-5, 5, 1001).astype(dtype)
    y[:5] = [np.nan, np.inf, -np.inf, -0.0, 0.0]
    expected = np.maximum(y, 0)
    conv_activations.relu(y)
    np.testing.assert_array_equal(y, expected)
    assert y.dtype == dtype


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32, np.int8])
def test_a_relu_node_matches_onnxruntime_bit_for_bit(dtype: Any) -> None:
    """The Relu kernel (elementwise.relu): onnxruntime's values, the sign of -0.0 included."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", elem, [2, 300])],
        [helper.make_tensor_value_info("y", elem, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    x = (RNG.standard_normal((2, 300)) * 50).astype(dtype)
    if x.dtype.kind == "f":
        x[0, :5] = [np.nan, np.inf, -np.inf, -0.0, 0.0]
    ours = epctx.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    theirs = run_ort(model, {"x": x})[0]
    assert ours.dtype == theirs.dtype
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(np.signbit(ours), np.signbit(theirs))


def test_silu_halved_of_a_strided_array() -> None:
    y = _array(6, 40, scale=5.0)
    view = y[:, ::2] * np.float32(conv_activations.SILU_SCALE)
    strided = np.empty((6, 40), np.float32)[:, ::2]
    strided[...] = view
    conv_activations.silu_halved(strided)
    y64 = y[:, ::2].astype(np.float64)
    np.testing.assert_allclose(strided, y64 / (1 + np.exp(-y64)), atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------------- the bias in an im2col conv's GEMM


class _Spy:
    """Counts the calls of ``conv_direct.im2col_gemm`` (the NCHW im2col route with the bias in its GEMM)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = conv_direct.im2col_gemm

        def counted(*args: Any) -> Any:
            self.calls += 1
            return real(*args)

        monkeypatch.setattr(conv_direct, "im2col_gemm", counted)


IM2COL = {
    "stride2_pad1": ((1, 3, 33, 40), (16, 3, 3, 3), {"pads": [1] * 4, "strides": [2, 2]}),
    "stride2_asymmetric": ((1, 5, 17, 20), (8, 5, 3, 3), {"pads": [0, 1, 1, 0], "strides": [2, 2]}),
    "stride3_5x5": ((1, 4, 23, 19), (6, 4, 5, 5), {"pads": [2, 1, 2, 1], "strides": [3, 2]}),
    "stride1_pad1": ((1, 8, 12, 12), (16, 8, 3, 3), {"pads": [1] * 4}),
    "stride1_no_pad": ((1, 4, 10, 11), (6, 4, 3, 2), {}),
    "dilated_strided": (
        (1, 4, 21, 21),
        (8, 4, 3, 3),
        {"pads": [2] * 4, "strides": [2, 2], "dilations": [2, 2]},
    ),
    "auto_pad": ((1, 4, 15, 16), (8, 4, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "conv_3d": ((1, 3, 6, 7, 8), (4, 3, 3, 3, 3), {"pads": [1] * 6, "strides": [2, 2, 2]}),
}


@pytest.mark.parametrize("form", list(IM2COL))
@pytest.mark.parametrize("tail", [IDENTITY, SILU], ids=["plain", "silu"])
def test_im2col_conv_adds_its_bias_in_the_gemm(
    monkeypatch: pytest.MonkeyPatch, form: str, tail: list[onnx.NodeProto], numpy_kernels: None
) -> None:
    spy = _Spy(monkeypatch)
    x_shape, w_shape, attrs = IM2COL[form]
    _check(_model(x_shape, w_shape, tail, **attrs), _array(*x_shape))
    assert spy.calls == 2


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs", "bias"),
    [
        ((1, 8, 12, 12), (16, 8, 3, 3), {"pads": [1] * 4}, False),  # no bias to add
        ((2, 3, 17, 17), (8, 3, 3, 3), {"pads": [1] * 4, "strides": [2, 2]}, True),  # a batch of two
        ((1, 8, 12, 12), (8, 4, 3, 3), {"pads": [1] * 4, "group": 2}, True),  # grouped
        ((1, 16, 12, 12), (16, 1, 3, 3), {"pads": [1] * 4, "group": 16}, True),  # depthwise
        ((1, 8, 12, 12), (16, 8, 1, 1), {}, True),  # 1x1
        ((1, 6, 50), (10, 6, 5), {"pads": [2, 2]}, True),  # a short 1-D conv (conv_short.py)
    ],
)
def test_other_convs_do_not_take_the_biased_im2col(
    monkeypatch: pytest.MonkeyPatch,
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    attrs: dict[str, Any],
    bias: bool,
) -> None:
    spy = _Spy(monkeypatch)
    _check(_model(x_shape, w_shape, IDENTITY, bias=bias, **attrs), _array(*x_shape))
    assert spy.calls == 0


def test_an_im2col_conv_with_weights_fed_at_run_time() -> None:
    """Weights fed at run time (prepared per call) with a constant bias: each call's own weights and bias."""
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["z"], pads=[1] * 4, strides=[2, 2])],
        "g",
        [
            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 15, 15]),
            helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [8, 3, 3, 3]),
        ],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(_array(8), "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    sess = epctx.InferenceSession(model.SerializeToString())
    for _ in range(3):
        feed = {"x": _array(1, 3, 15, 15), "w": _array(8, 3, 3, 3)}
        np.testing.assert_allclose(sess.run(None, feed)[0], run_ort(model, feed)[0], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------- the channels-last bias, tiled


@pytest.mark.parametrize(
    ("pixels", "channels"), [(12544, 16), (3136, 72), (49, 576), (97, 24), (4, 4096), (1, 3)]
)
def test_channels_last_bias_adds_the_bias_to_every_pixel(pixels: int, channels: int) -> None:
    """Over rows of T pixels (T a divisor of the pixels; 97 is prime: one pixel a row), or one pixel a row."""
    y = _array(pixels, channels)
    bias = _array(channels)
    expected = y + bias
    conv_direct.channels_last_bias(bias, pixels)(y)
    np.testing.assert_array_equal(y, expected)


def test_channels_last_bias_refuses_memory_it_would_copy() -> None:
    """A non-contiguous result cannot be viewed as rows: it raises, never adds to a copy."""
    add = conv_direct.channels_last_bias(_array(8), 64)
    with pytest.raises(AttributeError):
        add(np.zeros((8, 64), np.float32).T)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [
        ((1, 16, 56, 56), (16, 1, 3, 3), {"pads": [1] * 4, "group": 16}),  # depthwise, handing over
        ((1, 32, 28, 28), (32, 1, 3, 3), {"pads": [1] * 4, "group": 32, "strides": [2, 2]}),
        ((1, 3, 64, 64), (16, 3, 3, 3), {"pads": [1] * 4, "strides": [2, 2]}),  # im2col, handing over
    ],
)
def test_a_conv_handing_over_channels_last_adds_its_bias(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any]
) -> None:
    """The conv's reader is a depthwise conv (it takes channels-last memory): the conv's result, its bias
    added in tiled rows, goes over channels-last."""
    c = w_shape[0]
    tail = [
        helper.make_node("Relu", ["y"], ["r"]),
        helper.make_node("Conv", ["r", "wd"], ["z"], group=c, pads=[1] * 4),
    ]
    data = _model(x_shape, w_shape, tail, **attrs)
    model = onnx.load_from_string(data)
    model.graph.initializer.append(numpy_helper.from_array(_array(c, 1, 3, 3, scale=0.3), "wd"))
    _check(model.SerializeToString(), _array(*x_shape))


# ----------------------------------------------------- flat GEMMs (conv_flat.py) only on maps wide enough


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs", "flat"),
    [
        ((1, 64, 7, 7), (64, 64, 3, 3), {"pads": [1] * 4}, False),  # 9 columns computed per 7: im2col
        ((1, 32, 14, 14), (16, 32, 5, 5), {"pads": [2] * 4}, False),  # 18 per 14
        ((1, 16, 9, 9), (16, 16, 3, 3), {"pads": [2] * 4, "dilations": [2, 2]}, False),  # 13 per 9
        ((1, 32, 8, 8), (32, 32, 3, 3), {"pads": [1] * 4}, True),  # 10 per 8: a quarter, flat
        ((1, 32, 20, 20), (16, 32, 3, 3), {"pads": [1] * 4}, True),
        ((1, 16, 7, 7), (32, 16, 3, 3), {"pads": [1] * 4}, False),  # M > C: never flat
    ],
)
def test_narrow_maps_take_im2col_not_flat_gemms(
    monkeypatch: pytest.MonkeyPatch,
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    attrs: dict[str, Any],
    flat: bool,
    numpy_kernels: None,
) -> None:
    from epctx.providers.cpu.kernels import conv_flat

    spy = _Spy(monkeypatch)
    runs = 0
    real = conv_flat.FlatGemm.run

    def counted(self: Any, *args: Any) -> Any:
        nonlocal runs
        runs += 1
        return real(self, *args)

    monkeypatch.setattr(conv_flat.FlatGemm, "run", counted)
    _check(_model(x_shape, w_shape, IDENTITY, **attrs), _array(*x_shape))
    assert (runs, spy.calls) == ((2, 0) if flat else (0, 2))


def test_flat_gemms_share_one_block_per_runner(shared_jobs: list[int], numpy_kernels: None) -> None:
    """At two runners a large flat GEMM (cblas) is two blocks, each all nine offsets' GEMMs of its part, one
    taken by a helper thread (blocks of numpy calls took the GIL back and forth: the corpus YOLO at two threads
    33.9 ms shared that way, 24.4 not); the same numbers as onnxruntime."""
    from epctx.providers.cpu.cblas import gemm_for

    if gemm_for(np.dtype(np.float32)) is None:
        pytest.skip("numpy's BLAS is not an OpenBLAS whose cblas_sgemm this process calls")
    data = _model((1, 64, 40, 40), (64, 64, 3, 3), IDENTITY, pads=[1] * 4)
    sess = epctx.InferenceSession(data)
    x = _array(1, 64, 40, 40)
    for _ in range(2):
        np.testing.assert_allclose(
            sess.run(None, {"x": x})[0], run_ort(data, {"x": x})[0], atol=1e-4, rtol=1e-4
        )
    assert shared_jobs == [2, 2]


@pytest.mark.parametrize("op", ["HardSigmoid", "HardSwish"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])  # onnxruntime has no float64 kernels of these
def test_hard_sigmoid_and_hard_swish_nodes_match_onnxruntime(op: str, dtype: Any) -> None:
    """The standalone kernels clip to [0, 1] in one pass (elementwise._unit); NaN and infinities included."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    attrs = {"alpha": 0.3, "beta": 0.4} if op == "HardSigmoid" else {}
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], **attrs)],
        "g",
        [helper.make_tensor_value_info("x", elem, [3, 200])],
        [helper.make_tensor_value_info("y", elem, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    x = (RNG.standard_normal((3, 200)) * 5).astype(dtype)
    x[0, :3] = [np.nan, np.inf, -np.inf]
    ours = epctx.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    theirs = run_ort(model, {"x": x})[0]
    assert ours.dtype == theirs.dtype
    tol = 2e-3 if dtype == np.float16 else 1e-6
    np.testing.assert_allclose(ours.astype(np.float64), theirs.astype(np.float64), atol=tol, rtol=tol)


# ------------------------------------------------------------------------ MaxPool one axis at a time (pool.py)

MAX_POOLS = {
    "sppf_5x5": ((1, 16, 10, 10), {"kernel_shape": [5, 5], "pads": [2] * 4}),
    "3x3_stride2": ((2, 8, 15, 16), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4}),
    "2x2_stride2": ((1, 4, 8, 9), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "ceil_mode": ((1, 3, 9, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "dilated": ((1, 3, 12, 13), {"kernel_shape": [3, 2], "dilations": [2, 3], "pads": [1, 1, 1, 1]}),
    "row_stride": ((1, 5, 7, 11), {"kernel_shape": [3, 3], "strides": [1, 2], "pads": [1] * 4}),
    "asymmetric_1xk": ((1, 6, 9, 20), {"kernel_shape": [1, 7], "pads": [0, 3, 0, 3]}),
    "1d": ((2, 4, 30), {"kernel_shape": [5], "pads": [2, 2]}),
    "3d": ((1, 2, 6, 7, 8), {"kernel_shape": [3, 3, 3], "pads": [1] * 6}),
    "same_upper": ((1, 3, 11, 11), {"kernel_shape": [4, 4], "auto_pad": "SAME_UPPER"}),
    "same_lower": ((1, 8, 11, 11), {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"}),
    # large, strided and padded: without the padded copy (pool_max.py)
    "resnet_stem": ((1, 64, 112, 112), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4}),
    "strided_asymmetric": (
        (2, 32, 75, 64),
        {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 0, 1]},
    ),
}


@pytest.mark.parametrize("form", list(MAX_POOLS))
@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int8])
def test_max_pool_one_axis_at_a_time_matches_onnxruntime(form: str, dtype: Any) -> None:
    x_shape, attrs = MAX_POOLS[form]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["y"], **attrs)],
        "g",
        [helper.make_tensor_value_info("x", elem, list(x_shape))],
        [helper.make_tensor_value_info("y", elem, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    model.ir_version = 8
    if dtype == np.float32:
        x = _array(*x_shape)
    else:
        x = RNG.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, x_shape, endpoint=True).astype(dtype)
    sess = epctx.InferenceSession(model.SerializeToString())
    for _ in range(2):
        ours = sess.run(None, {"x": x})[0]
        theirs = run_ort(model, {"x": x})[0]
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        assert ours.flags.c_contiguous
        np.testing.assert_array_equal(ours, theirs)


def test_max_pool_spreads_nan_to_every_window_that_holds_one() -> None:
    """As np.maximum over the windows did before (onnxruntime's result with NaN depends on where the NaN is in
    the window: it is not the oracle here)."""
    graph = helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[5, 5], pads=[2] * 4)],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 10, 10])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    model.ir_version = 8
    x = _array(1, 3, 10, 10)
    x.reshape(-1)[::17] = np.nan
    ours = epctx.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    padded = np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)), constant_values=-np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (5, 5), axis=(2, 3))
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(windows).any(axis=(-2, -1)))
    finite = ~np.isnan(ours)
    np.testing.assert_array_equal(ours[finite], np.nanmax(windows, axis=(-2, -1))[finite])
