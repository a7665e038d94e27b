"""A Conv's routes (providers/cpu/kernels/conv_direct.py): the first call of an input shape makes the route,
later calls of a Conv with constant weights take the kept one. Checked against onnxruntime and against the
first call bit for bit, with weights and biases fed at run time, other dtypes, changing shapes, an empty batch,
and the one-thread BLAS gate only where a BLAS call could use more threads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import helper, numpy_helper

import epctx
from epctx.errors import EPCtxError
from epctx.providers.cpu import blas_serial
from tests.oracle import run_ort

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(2121)


def _array(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.3).astype(dtype)


def _conv_model(
    x_shape: list[Any],
    w_shape: tuple[int, ...],
    *,
    bias: bool = True,
    fed: tuple[str, ...] = (),
    act: str | None = None,
    dtype: Any = np.float32,
    overridable: bool = False,
    **attrs: Any,
) -> bytes:
    """x -> Conv(w, b) [-> act]; ``fed``: those of "w", "b" that are graph inputs, not initializers;
    ``overridable``: the initializers are listed as graph inputs too (a feed may replace them)."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    names = ["x", "w", "b"] if bias else ["x", "w"]
    y = "y" if act is None else "y_pre"
    nodes = [helper.make_node("Conv", names, [y], name="conv", **attrs)]
    if act is not None:
        nodes.append(helper.make_node(act, [y], ["y"]))
    shapes = {"w": w_shape, "b": (w_shape[0],)}
    inputs = [helper.make_tensor_value_info("x", elem, x_shape)]
    inits = []
    for name in names[1:]:
        if name in fed or overridable:
            inputs.append(helper.make_tensor_value_info(name, elem, list(shapes[name])))
        if name not in fed:
            inits.append(numpy_helper.from_array(_array(*shapes[name], dtype=dtype), name))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", elem, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _routes(sess: Any) -> dict[Any, Any]:
    """The Conv kernel's kept routes (input shape -> route), from its closure."""
    for fn, *_ in sess._plan.steps:
        cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
        if "routes" in cells:
            return dict(cells["routes"])
    raise AssertionError("no Conv kernel in the plan")


def _compare(ours: np.ndarray, theirs: np.ndarray, dtype: Any = np.float32) -> None:
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    tol = 2e-2 if dtype == np.float16 else 1e-4
    np.testing.assert_allclose(ours.astype(np.float64), theirs.astype(np.float64), atol=tol, rtol=tol)


# (x shape, w shape, conv attributes, activation): the forms a route takes
FORMS: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[str, Any], str | None]] = {
    "dense_3x3": ((1, 8, 20, 24), (16, 8, 3, 3), {"pads": [1] * 4}, None),
    "dense_hard_swish_prescaled": ((1, 8, 20, 24), (16, 8, 3, 3), {"pads": [1] * 4}, "HardSwish"),
    "pointwise_lean_relu": ((1, 32, 6, 40), (24, 32, 1, 1), {}, "Relu"),
    "pointwise_strided": ((2, 16, 12, 12), (8, 16, 1, 1), {"strides": [2, 2]}, None),
    "depthwise_5x5": ((1, 40, 3, 96), (40, 1, 5, 5), {"group": 40, "pads": [2] * 4}, "HardSwish"),
    "grouped": ((1, 16, 10, 10), (16, 4, 3, 3), {"group": 4, "pads": [1] * 4}, None),
    "winograd_batch": ((2, 16, 16, 16), (16, 16, 3, 3), {"pads": [1] * 4}, "Relu"),
    "conv_1d": ((1, 6, 50), (10, 6, 5), {"pads": [2, 2]}, None),
}


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("bias", [True, False])
def test_kept_route_gives_the_first_calls_result(form: str, bias: bool) -> None:
    x_shape, w_shape, attrs, act = FORMS[form]
    data = _conv_model(list(x_shape), w_shape, bias=bias, act=act, **attrs)
    sess = epctx.InferenceSession(data)
    x = _array(*x_shape)
    first = sess.run(None, {"x": x})[0]
    assert set(_routes(sess)) == {x_shape}
    again = sess.run(None, {"x": x})[0]  # the kept route
    np.testing.assert_array_equal(again, first)
    _compare(again, run_ort(data, {"x": x})[0])
    other = _array(*x_shape)
    _compare(sess.run(None, {"x": other})[0], run_ort(data, {"x": other})[0])


@pytest.mark.parametrize("fed", [("w",), ("b",), ("w", "b")])
def test_weights_and_bias_fed_at_run_time_are_each_runs_own(fed: tuple[str, ...]) -> None:
    data = _conv_model([1, 8, 12, 12], (16, 8, 3, 3), fed=fed, pads=[1] * 4)
    sess = epctx.InferenceSession(data)
    for _ in range(3):
        feed = {"x": _array(1, 8, 12, 12)}
        if "w" in fed:
            feed["w"] = _array(16, 8, 3, 3)
        if "b" in fed:
            feed["b"] = _array(16)
        _compare(sess.run(None, feed)[0], run_ort(data, feed)[0])
    assert _routes(sess) == {}  # nothing kept: the next call's weights may differ


@pytest.mark.parametrize("form", ["dense_3x3", "depthwise_5x5"])
def test_an_initializer_listed_as_graph_input_takes_the_fed_value(form: str) -> None:
    """onnxruntime runs with the fed value of an initializer that is also a graph input (IR < 4 style); the
    CPU EP used to bake the initializer into the Conv and ignore the feed."""
    x_shape, w_shape, attrs, act = FORMS[form]
    data = _conv_model(list(x_shape), w_shape, act=act, overridable=True, **attrs)
    sess = epctx.InferenceSession(data)
    x = _array(*x_shape)
    _compare(sess.run(None, {"x": x})[0], run_ort(data, {"x": x})[0])  # the initializers
    for _ in range(2):
        feed = {"x": x, "w": _array(*w_shape), "b": _array(w_shape[0])}
        _compare(sess.run(None, feed)[0], run_ort(data, feed)[0])


def _oracle(data: bytes, x: np.ndarray) -> np.ndarray:
    """onnxruntime's result (onnx.reference's for float64: onnxruntime's CPU Conv has no float64 kernel)."""
    if x.dtype != np.float64:
        return np.asarray(run_ort(data, {"x": x})[0])
    from onnx.reference import ReferenceEvaluator

    return np.asarray(ReferenceEvaluator(data).run(None, {"x": x})[0])


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_other_dtypes(dtype: Any) -> None:
    data = _conv_model([1, 8, 10, 10], (12, 8, 3, 3), dtype=dtype, pads=[1] * 4)
    sess = epctx.InferenceSession(data)
    for _ in range(3):
        x = _array(1, 8, 10, 10, dtype=dtype)
        _compare(sess.run(None, {"x": x})[0], _oracle(data, x), dtype)
    # float16: computed in float32 each call (weights converted once), no route kept; float64: kept
    assert set(_routes(sess)) == ({(1, 8, 10, 10)} if dtype == np.float64 else set())


def test_each_input_shape_gets_its_route_and_an_empty_batch_its_zeros() -> None:
    data = _conv_model(["n", 8, "h", "w"], (16, 8, 3, 3), act="Relu", pads=[1] * 4)
    sess = epctx.InferenceSession(data)
    shapes = [(1, 8, 10, 12), (2, 8, 7, 9), (1, 8, 10, 12), (0, 8, 10, 12), (0, 8, 10, 12)]
    for shape in shapes:
        x = _array(*shape)
        _compare(sess.run(None, {"x": x})[0], run_ort(data, {"x": x})[0])
    assert set(_routes(sess)) == set(shapes)


class _GateCount:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = blas_serial._SerialGate.__call__

        def counted(gate: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real(gate, fn, *args, **kwargs)

        monkeypatch.setattr(blas_serial._SerialGate, "__call__", counted)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs", "gated"),
    [
        # 12 x 12 x 8 x 16 x 9 = 166k multiply-adds: OpenBLAS keeps the GEMM on one thread itself
        ((1, 8, 12, 12), (16, 8, 3, 3), {"pads": [1] * 4}, False),
        # 2.4M multiply-adds (under SERIAL_MACS): the GEMM on one thread through the gate
        ((1, 32, 24, 24), (64, 32, 1, 1), {}, True),
        # a depthwise conv calls no BLAS; this one (0.5M) shares no einsum with helper threads either
        ((1, 200, 2, 96), (200, 1, 5, 5), {"group": 200, "pads": [2] * 4}, False),
    ],
)
def test_the_one_thread_gate_only_where_blas_could_use_more_threads(
    monkeypatch: pytest.MonkeyPatch,
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    attrs: dict[str, Any],
    gated: bool,
    numpy_kernels: None,
) -> None:
    count = _GateCount(monkeypatch)
    data = _conv_model(list(x_shape), w_shape, **attrs)
    sess = epctx.InferenceSession(data)
    x = _array(*x_shape)
    sess.run(None, {"x": x})  # the first call: the route made
    count.calls = 0
    ours = sess.run(None, {"x": x})[0]
    assert (count.calls > 0) is gated
    _compare(ours, run_ort(data, {"x": x})[0])


def test_a_wrong_input_names_the_node() -> None:
    """The first call of a shape checks the input against the weights; the error names the Conv."""
    data = _conv_model([1, "c", "h", "w"], (16, 8, 3, 3), pads=[1] * 4)
    sess = epctx.InferenceSession(data)
    sess.run(None, {"x": _array(1, 8, 6, 6)})
    with pytest.raises(EPCtxError, match="conv") as caught:
        sess.run(None, {"x": _array(1, 4, 6, 6)})
    assert "input has 4 channels" in str(caught.value)
    assert set(_routes(sess)) == {(1, 8, 6, 6)}


def _depthwise(sess: Any) -> Any:
    """The depthwise conv's channels-last plan (kernels/depthwise.py), from the Conv kernel's closures."""
    from epctx.providers.cpu.kernels.conv import _ConvPlan

    for fn, *_ in sess._plan.steps:
        cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
        first = cells.get("half")
        for cell in (first.__closure__ or ()) if first is not None else ():
            inner = cell.cell_contents
            for c in getattr(inner, "__closure__", None) or ():
                if isinstance(c.cell_contents, dict):
                    plans = [p for p in c.cell_contents.values() if isinstance(p, _ConvPlan)]
                    if plans and plans[0].channels_last is not None:
                        return plans[0].channels_last
    raise AssertionError("no channels-last depthwise conv in the plan")


@pytest.mark.parametrize(
    ("x_shape", "k", "pads", "banded"),
    [
        ((1, 64, 2, 20), 5, [2] * 4, True),
        ((1, 32, 2, 8), 3, [4, 1, 4, 1], True),  # whole output rows of padding
        ((1, 48, 9, 9), 5, [2] * 4, False),
    ],
    ids=["bands", "rows_of_padding", "whole"],
)
def test_depthwise_lays_out_its_einsums_once(
    x_shape: tuple[int, ...], k: int, pads: list[int], banded: bool, numpy_kernels: None
) -> None:
    """The windows of a depthwise conv's einsums (per band: offset, shape, strides, filter and output rows) are
    laid out at the first call and reused: each call's result the first's for the same input."""
    c = x_shape[1]
    data = _conv_model(list(x_shape), (c, 1, k, k), group=c, pads=pads, act="Relu")
    sess = epctx.InferenceSession(data)
    x = _array(*x_shape)
    first = sess.run(None, {"x": x})[0]
    conv = _depthwise(sess)
    assert (conv.bands is not None) is banded
    (layout,) = conv._layouts.values()
    assert (layout.whole is None) is banded
    assert bool(layout.zero) is (pads[0] > k)  # the output rows whose kernel rows all read padding
    for _ in range(2):
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], first)
    assert list(conv._layouts.values()) == [layout]
    _compare(first, run_ort(data, {"x": x})[0])


def test_concurrent_runs_of_a_real_model_through_kept_routes(tmp_path: Path) -> None:
    """PP-OCR's direction classifier (depthwise convs in bands, hand-offs, squeeze-excitation blocks): runs from
    four threads at once give each input's sequential result, bit for bit (routes and layouts are shared,
    scratch buffers not)."""
    from concurrent.futures import ThreadPoolExecutor

    from benchmarks.corpus import Unavailable, feeds, materialise

    try:
        model = materialise("ppocr_cls", tmp_path)
    except Unavailable as exc:
        pytest.skip(str(exc))
    ((name, x),) = feeds("ppocr_cls").items()
    sess = epctx.InferenceSession(str(model))
    inputs = [x + _array(*x.shape) for _ in range(6)]
    expected = [sess.run(None, {name: xi})[0] for xi in inputs]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda xi: sess.run(None, {name: xi})[0], inputs * 4))
    for k, y in enumerate(got):
        np.testing.assert_array_equal(y, expected[k % len(inputs)])


def test_profiled_runs_record_each_conv_and_give_the_plain_runs_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With profiling on, every run records one Node event per conv (named, CPU EP), the first run making
    the routes and the second taking them, with the results of a session without profiling."""
    import json

    data = _conv_model([1, 40, 3, 96], (40, 1, 5, 5), group=40, pads=[2] * 4, act="HardSwish")
    monkeypatch.chdir(tmp_path)
    so = epctx.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = "trace"
    profiled, plain = epctx.InferenceSession(data, so), epctx.InferenceSession(data)
    x = _array(1, 40, 3, 96)
    for _ in range(2):
        np.testing.assert_array_equal(profiled.run(None, {"x": x})[0], plain.run(None, {"x": x})[0])
    with open(profiled.end_profiling()) as f:
        nodes = [e for e in json.load(f) if e["cat"] == "Node"]
    assert [e["name"].split("_kernel_time")[0] for e in nodes] == ["conv", "conv"]
    assert {e["args"]["provider"] for e in nodes} == {"CPUExecutionProvider"}


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "strided"])
def test_pixel_rows_of_each_layout(layout: str) -> None:
    """A 1x1 conv's (H * W, C) operand: a view of contiguous or channels-last memory, a copy otherwise."""
    from epctx.providers.cpu.kernels.channel_rows import PixelRows, channel_rows

    base = _array(1, 6, 20, 12)
    x = {
        "contiguous": base,
        "channels_last": np.ascontiguousarray(base.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2),
        "strided": _array(1, 6, 20, 14)[..., 1:13],  # rows of 12 values 14 apart: no view
    }[layout]
    rows = PixelRows(6, 240, 2)(x)
    np.testing.assert_array_equal(rows, x[0].reshape(6, 240).T)
    assert np.shares_memory(rows, x) is (layout != "strided")
    np.testing.assert_array_equal(rows.T, channel_rows(x, 1, 6, 240)[0])
