"""Own CPU kernels of the conv / pool / normalization / resize family against onnxruntime (CPU).

Each case is a one-node model; inputs listed in ``const`` become initializers so the factory-time
precomputation paths (reshaped conv weights, Winograd transforms, folded batch-norm affine) run too.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import epctx
import epctx.providers.cpu.kernels
from epctx.providers.cpu.kernels import conv as conv_kernels
from epctx.providers.cpu.kernels import depthwise, winograd
from epctx.providers.cpu.registry import find_factory
from tests.oracle import assert_matches_ort, graph_inputs_for

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(20240607)
F32 = np.float32


def _f(*shape: int, dtype: Any = F32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def _model(
    op: str,
    inputs: Sequence[Any],
    attrs: dict[str, Any] | None = None,
    *,
    opset: int = 21,
    const: Sequence[int] = (),
    out_types: Sequence[int] | None = None,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    names, graph_inputs, inits, feeds = graph_inputs_for(inputs, const)
    x = inputs[0]
    types = list(out_types or [helper.np_dtype_to_tensor_dtype(x.dtype)])
    outs = [f"out{k}" for k in range(len(types))]
    node = helper.make_node(op, names, outs, **(attrs or {}))
    outputs = [helper.make_tensor_value_info(o, t, [None] * x.ndim) for o, t in zip(outs, types)]
    graph = helper.make_graph([node], "g", graph_inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return model, feeds


def _check(op: str, inputs: Sequence[Any], attrs: dict[str, Any] | None = None, **kw: Any) -> None:
    tol = {k: kw.pop(k) for k in ("atol", "rtol") if k in kw}
    model, feeds = _model(op, inputs, attrs, **kw)
    assert_matches_ort(model, feeds, **tol)


@pytest.mark.parametrize(
    ("op", "opset"),
    [
        ("Conv", 11),
        ("ConvTranspose", 11),
        ("MaxPool", 12),
        ("AveragePool", 19),
        ("LpPool", 18),
        ("GlobalAveragePool", 1),
        ("GlobalMaxPool", 1),
        ("GlobalLpPool", 2),
        ("BatchNormalization", 9),
        ("BatchNormalization", 15),
        ("LayerNormalization", 17),
        ("InstanceNormalization", 6),
        ("GroupNormalization", 21),
        ("LpNormalization", 1),
        ("Resize", 10),
        ("Resize", 19),
        ("Upsample", 9),
    ],
)
def test_own_kernel_registered(op: str, opset: int) -> None:
    assert find_factory("", op, opset) is not None


# --------------------------------------------------------------------------------------------------------
# Conv / ConvTranspose

CONV_CASES = [
    ((1, 3, 10, 10), (4, 3, 3, 3), {}),
    ((2, 4, 9, 11), (6, 2, 3, 2), {"group": 2, "strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2]}),
    ((1, 8, 7, 7), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}),
    ((2, 8, 9, 7), (16, 1, 3, 3), {"group": 8, "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 8, 7, 7), (16, 1, 3, 3), {"group": 8, "auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ((1, 8, 7, 7), (5, 8, 1, 1), {"strides": [2, 2]}),
    ((2, 8, 7, 7), (4, 4, 1, 1), {"group": 2}),
    ((1, 8, 6, 6), (4, 8, 1, 1), {"pads": [1, 1, 0, 0]}),
    ((1, 3, 10), (4, 3, 3), {"auto_pad": "VALID", "strides": [3]}),
    ((2, 3, 12), (4, 3, 5), {"pads": [2, 1], "dilations": [2]}),
    ((1, 2, 5, 6, 7), (3, 2, 3, 2, 3), {"pads": [1, 0, 1, 1, 1, 0], "strides": [1, 2, 1]}),
    ((1, 3, 32, 30), (16, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    # Winograd-eligible: 3x3, stride 1, >= 16 channels, >= 64 output tiles
    ((1, 16, 16, 18), (16, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 32, 17, 15), (24, 32, 3, 3), {"pads": [0, 1, 2, 1]}),
    ((1, 32, 16, 16), (32, 32, 3, 3), {"auto_pad": "SAME_UPPER"}),
    ((1, 16, 20, 21), (16, 16, 3, 3), {}),
    ((3, 16, 8, 9), (16, 16, 3, 3), {"pads": [2, 2, 2, 2]}),
    # depthwise with >= 32 channels: channels-last einsum (multiplier 2, 1-D, 3-D, strides, dilations, SAME)
    ((1, 48, 9, 9), (48, 1, 5, 5), {"group": 48, "pads": [2, 2, 2, 2]}),
    (
        (2, 32, 11, 10),
        (64, 1, 3, 3),
        {"group": 32, "strides": [2, 2], "pads": [1, 0, 1, 1], "dilations": [1, 2]},
    ),
    ((1, 40, 13), (40, 1, 5), {"group": 40, "auto_pad": "SAME_UPPER", "strides": [2]}),
    ((1, 32, 4, 5, 6), (32, 1, 3, 3, 3), {"group": 32, "pads": [1, 1, 1, 1, 1, 1]}),
    ((1, 64, 7, 7), (64, 1, 3, 3), {"group": 64, "auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ((1, 32, 6, 6), (32, 1, 3, 3), {"group": 32}),
    # depthwise on few rows, padding most of the kernel rows: einsums over output-row bands (PP-OCR cls)
    ((1, 64, 2, 20), (64, 1, 5, 5), {"group": 64, "pads": [2, 2, 2, 2]}),
    ((2, 48, 3, 17), (48, 1, 5, 5), {"group": 48, "pads": [2, 2, 2, 2], "strides": [2, 1]}),
    ((1, 40, 3, 9), (80, 1, 3, 3), {"group": 40, "pads": [3, 1, 0, 1], "dilations": [2, 1]}),
    ((1, 32, 2, 8), (32, 1, 3, 3), {"group": 32, "pads": [4, 1, 4, 1]}),  # whole output rows of padding
    # depthwise in column blocks (2-D, column stride 1): few channels, dilations, asymmetric pads, row stride,
    # a prime output width (blocks of 1 or of the whole width), a filter too large to tile (blocks of 1)
    ((2, 8, 12, 13), (8, 1, 3, 3), {"group": 8, "pads": [1, 0, 2, 1], "dilations": [2, 1]}),
    ((1, 40, 33, 32), (40, 1, 5, 5), {"group": 40, "pads": [2, 2, 2, 2]}),
    ((1, 16, 10, 9), (16, 1, 1, 3), {"group": 16, "auto_pad": "SAME_UPPER"}),
    (
        (2, 12, 9, 11),
        (12, 1, 3, 3),
        {"group": 12, "pads": [1, 2, 1, 2], "dilations": [1, 2], "strides": [2, 1]},
    ),
    ((1, 1400, 3, 4), (1400, 1, 5, 5), {"group": 1400, "pads": [2, 2, 2, 2]}),
    # pointwise convs of one image: one GEMM called straight away (a small one, one on the one-thread gate)
    ((1, 16, 5, 5), (8, 16, 1, 1), {}),
    ((1, 64, 32, 32), (64, 64, 1, 1), {}),
    # dense stride-1 with M <= C: one GEMM per kernel offset on shifted runs (dilations, pads, batch, SAME)
    ((2, 8, 9, 11), (6, 8, 3, 2), {"pads": [1, 0, 2, 1], "dilations": [2, 1]}),
    ((1, 12, 7, 8), (12, 12, 2, 2), {"auto_pad": "SAME_LOWER"}),
    ((1, 40, 30, 31), (24, 40, 3, 3), {"pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize("const", [(), (1, 2)], ids=["runtime_w", "const_w"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize(("xs", "ws", "attrs"), CONV_CASES)
def test_conv(
    xs: tuple[int, ...], ws: tuple[int, ...], attrs: dict[str, Any], bias: bool, const: Any
) -> None:
    x, w = _f(*xs), _f(*ws)
    inputs = [x, w, _f(ws[0])] if bias else [x, w]
    _check("Conv", inputs, attrs, const=const, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("xs", "ws", "attrs", "block"),
    [
        ((1, 32, 6, 96), (32, 1, 3, 3), {"pads": [1, 1, 1, 1]}, 96),  # 96 * 9 * 32 values fit the tile
        ((1, 200, 2, 96), (200, 1, 5, 5), {"pads": [2, 2, 2, 2]}, 6),  # the largest divisor of 96 that fits
        ((1, 40, 3, 13), (40, 1, 5, 5), {"pads": [2, 2, 2, 2]}, 13),
        ((1, 1400, 3, 4), (1400, 1, 5, 5), {"pads": [2, 2, 2, 2]}, 1),  # one column is over the tile already
        ((1, 32, 8, 8), (32, 1, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, 4),  # 2 phases, 2 taps
        ((1, 16, 13, 15), (16, 1, 5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2]}, 8),
        ((2, 24, 9, 12), (24, 1, 3, 3), {"pads": [1, 0, 1, 2], "strides": [1, 3]}, 4),  # 3 phases, 1 tap
        ((1, 40, 6, 11), (40, 1, 4, 4), {"pads": [1, 2, 1, 1], "strides": [2, 2]}, 6),  # even kernel
        ((1, 8, 9, 9), (8, 1, 3, 3), {"pads": [1, 1, 1, 1], "strides": [1, 2], "dilations": [1, 2]}, 0),
        ((1, 32, 8, 8), (64, 1, 3, 3), {"pads": [1, 1, 1, 1]}, 0),  # two output channels per group
    ],
)
def test_depthwise_column_blocks(
    xs: tuple[int, ...], ws: tuple[int, ...], attrs: dict[str, Any], block: int, numpy_kernels: None
) -> None:
    dilations = tuple(attrs.get("dilations", (1, 1)))
    geo = conv_kernels.spatial_geometry(
        xs[2:], ws[2:], tuple(attrs.get("strides", (1, 1))), dilations, attrs["pads"], "NOTSET"
    )
    assert depthwise.column_block(xs, ws, geo) == block
    _check(
        "Conv", [_f(*xs), _f(*ws), _f(ws[0])], {"group": xs[1], **attrs}, const=(1, 2), atol=1e-4, rtol=1e-4
    )


@pytest.mark.parametrize(
    ("xs", "ws", "attrs", "lean", "tiny"),
    [
        ((1, 16, 5, 5), (8, 16, 1, 1), {}, True, True),
        ((1, 64, 32, 32), (64, 64, 1, 1), {}, True, False),
        ((2, 16, 5, 5), (8, 16, 1, 1), {}, False, True),  # a batch
        ((1, 8, 7, 7), (5, 8, 1, 1), {"strides": [2, 2]}, False, True),
        ((1, 256, 64, 64), (256, 256, 1, 1), {}, False, False),  # large: column blocks shared with helpers
    ],
)
def test_lean_pointwise_plans(
    xs: tuple[int, ...], ws: tuple[int, ...], attrs: dict[str, Any], lean: bool, tiny: bool
) -> None:
    geo = conv_kernels.spatial_geometry(
        xs[2:], ws[2:], tuple(attrs.get("strides", (1, 1))), (1, 1), None, "NOTSET"
    )
    plan = conv_kernels._ConvPlan(xs, ws, geo, 1)
    assert (plan.lean, plan.tiny) == (lean, tiny)
    if lean:  # a fresh array of the output's shape, not a view: the session hands it over without a copy
        x, w = _f(*xs), _f(*ws)
        y = plan.pointwise_gemm(x, w.reshape(ws[0], ws[1]))
        assert y.base is None and y.shape == (1, ws[0], *xs[2:])
        np.testing.assert_allclose(y[0], np.einsum("mc,chw->mhw", w[:, :, 0, 0], x[0]), rtol=1e-5, atol=1e-5)


BANDED_CASES = [c for c in CONV_CASES if c[0][1] >= 32 and c[0][2] <= 3 and c[2].get("group")]
DEPTHWISE_CASES = [c for c in CONV_CASES if c[2].get("group") and c[1][1] == 1]


@pytest.mark.parametrize(("xs", "ws", "attrs"), DEPTHWISE_CASES)
def test_depthwise_numpy_forms(
    xs: tuple[int, ...], ws: tuple[int, ...], attrs: dict[str, Any], numpy_kernels: None
) -> None:
    """The depthwise cases of test_conv without the native kernels (which test_conv runs where they are built):
    the numpy forms (einsum, column blocks, row bands, per offset) give onnxruntime's numbers."""
    x, w = _f(*xs), _f(*ws)
    _check("Conv", [x, w, _f(ws[0])], attrs, const=(1, 2), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("xs", "ws", "attrs"), BANDED_CASES)
def test_depthwise_on_few_rows_runs_in_bands(
    xs: tuple[int, ...], ws: tuple[int, ...], attrs: dict[str, Any], numpy_kernels: None
) -> None:
    """Without the native kernels, the cases above take the banded einsum (test_depthwise_numpy_forms checks
    their numbers against onnxruntime)."""
    geo = conv_kernels.spatial_geometry(
        xs[2:],
        ws[2:],
        tuple(attrs.get("strides", (1, 1))),
        tuple(attrs.get("dilations", (1, 1))),
        attrs["pads"],
        "NOTSET",
    )
    plan = conv_kernels._ConvPlan(xs, ws, geo, attrs["group"])
    assert plan.channels_last is not None and plan.channels_last.bands is not None


WINOGRAD_CASES = [
    c
    for c in CONV_CASES
    if c[1][2:] == (3, 3) and c[0][1] >= 16 and not c[2].get("strides") and not c[2].get("group")
]


@pytest.mark.parametrize("const", [(), (1, 2)], ids=["runtime_w", "const_w"])
@pytest.mark.parametrize(("xs", "ws", "attrs"), WINOGRAD_CASES)
def test_conv_winograd(
    xs: tuple[int, ...],
    ws: tuple[int, ...],
    attrs: dict[str, Any],
    const: Any,
    monkeypatch: pytest.MonkeyPatch,
    numpy_kernels: None,
) -> None:
    # Winograd runs only when BLAS is single-threaded; force it so the path is tested on any machine.
    monkeypatch.setattr(winograd, "blas_single_threaded", lambda: True)
    geo = conv_kernels.spatial_geometry(
        xs[2:], ws[2:], (1, 1), (1, 1), attrs.get("pads"), attrs.get("auto_pad", "NOTSET")
    )
    assert conv_kernels._ConvPlan(xs, ws, geo, 1).winograd is not None
    _check("Conv", [_f(*xs), _f(*ws), _f(ws[0])], attrs, const=const, atol=1e-4, rtol=1e-4)


def test_conv_opset1_and_kernel_shape_attr() -> None:
    x, w = _f(1, 4, 8, 8), _f(6, 4, 3, 3)
    _check("Conv", [x, w], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, opset=1, atol=1e-4, rtol=1e-4)


CONV_T_CASES = [
    ((1, 3, 4, 4), (3, 2, 3, 3), {}),
    (
        (1, 4, 4, 5),
        (4, 3, 3, 2),
        {"group": 2, "strides": [2, 3], "pads": [1, 0, 0, 1], "dilations": [2, 1], "output_padding": [1, 1]},
    ),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "output_shape": [9, 10]}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "output_shape": [8, 8], "auto_pad": "SAME_UPPER"}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 3, 5, 5), (3, 2, 2, 2), {"auto_pad": "VALID", "strides": [2, 2]}),
    ((2, 3, 5), (3, 2, 4), {"strides": [2]}),
    ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), {"strides": [2, 1, 2], "pads": [0, 1, 0, 0, 1, 1]}),
    (
        (1, 8, 6, 6),
        (8, 1, 3, 3),
        {"group": 8, "strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
    ),
]


@pytest.mark.parametrize("const", [(), (1, 2)], ids=["runtime_w", "const_w"])
@pytest.mark.parametrize(("xs", "ws", "attrs"), CONV_T_CASES)
def test_conv_transpose(xs: tuple[int, ...], ws: tuple[int, ...], attrs: dict[str, Any], const: Any) -> None:
    x, w = _f(*xs), _f(*ws)
    b = _f(ws[1] * int(attrs.get("group", 1)))
    _check("ConvTranspose", [x, w, b], attrs, const=const, atol=1e-4, rtol=1e-4)
    _check("ConvTranspose", [x, w], attrs, const=const, atol=1e-4, rtol=1e-4)


def test_conv_does_not_modify_inputs() -> None:
    x, w, b = _f(1, 16, 16, 16), _f(16, 16, 3, 3), _f(16)
    copies = [a.copy() for a in (x, w, b)]
    model, feeds = _model("Conv", [x, w, b], {"pads": [1, 1, 1, 1]})
    epctx.InferenceSession(model.SerializeToString()).run(None, feeds)
    for a, c in zip((x, w, b), copies):
        np.testing.assert_array_equal(a, c)


def test_conv_concurrent_runs_share_no_scratch() -> None:
    """Scratch buffers are reused between calls: concurrent runs must still get their own."""
    from concurrent.futures import ThreadPoolExecutor

    model, _ = _model(
        "Conv", [_f(1, 16, 20, 20), _f(16, 16, 3, 3), _f(16)], {"pads": [1, 1, 1, 1]}, const=(1, 2)
    )
    session = epctx.InferenceSession(model.SerializeToString())
    inputs = [_f(1, 16, 20, 20) for _ in range(8)]
    expected = [session.run(None, {"in0": x})[0] for x in inputs]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda x: session.run(None, {"in0": x})[0], inputs * 4))
    for k, y in enumerate(got):
        np.testing.assert_array_equal(y, expected[k % len(inputs)])


# --------------------------------------------------------------------------------------------------------
# Pools

POOL_GEOMETRIES = [
    {"kernel_shape": [3, 3]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [0, 1, 1, 0]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 2], "strides": [3, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER", "strides": [2, 2]},
    {"kernel_shape": [3, 3], "auto_pad": "VALID", "strides": [2, 2]},
    {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [2, 2], "dilations": [2, 1], "strides": [2, 2], "ceil_mode": 1},
]
POOL_INPUTS = [(2, 3, 7, 8), (1, 2, 10, 9)]


@pytest.mark.parametrize("shape", POOL_INPUTS)
@pytest.mark.parametrize("geo", POOL_GEOMETRIES)
def test_max_pool(geo: dict[str, Any], shape: tuple[int, ...]) -> None:
    x = _f(*shape)
    _check("MaxPool", [x], geo, opset=12)
    _check("MaxPool", [x], geo, opset=12, out_types=[TensorProto.FLOAT, TensorProto.INT64])
    _check(
        "MaxPool",
        [x],
        {**geo, "storage_order": 1},
        opset=12,
        out_types=[TensorProto.FLOAT, TensorProto.INT64],
    )


@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("shape", POOL_INPUTS)
@pytest.mark.parametrize("geo", POOL_GEOMETRIES)
def test_average_pool(geo: dict[str, Any], shape: tuple[int, ...], include_pad: int) -> None:
    _check("AveragePool", [_f(*shape)], {**geo, "count_include_pad": include_pad}, opset=19, atol=1e-6)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("geo", POOL_GEOMETRIES)
def test_lp_pool(geo: dict[str, Any], p: int) -> None:
    _check("LpPool", [_f(2, 3, 7, 8)], {**geo, "p": p}, opset=18, atol=1e-5)


@pytest.mark.parametrize(
    ("shape", "attrs"),
    [
        ((2, 3, 11), {"kernel_shape": [3]}),
        ((2, 3, 11), {"kernel_shape": [3], "strides": [2], "pads": [1, 1], "ceil_mode": 1}),
        ((1, 2, 5, 6, 7), {"kernel_shape": [3, 2, 3]}),
        ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 1]}),
    ],
)
def test_pools_1d_3d(shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    x = _f(*shape)
    two = [TensorProto.FLOAT, TensorProto.INT64]
    _check("MaxPool", [x], attrs, opset=12, out_types=two)
    _check("MaxPool", [x], {**attrs, "storage_order": 1}, opset=12, out_types=two)
    _check("AveragePool", [x], attrs, opset=19, atol=1e-6)
    _check("AveragePool", [x], {**attrs, "count_include_pad": 1}, opset=19, atol=1e-6)


def test_max_pool_int8_and_old_opsets() -> None:
    xi = RNG.integers(-100, 100, (1, 2, 6, 6)).astype(np.int8)
    _check("MaxPool", [xi], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, opset=12)
    x = _f(1, 2, 9, 9)
    _check("MaxPool", [x], {"kernel_shape": [3, 3], "strides": [2, 2]}, opset=1)
    _check(
        "MaxPool", [x], {"kernel_shape": [2, 2]}, opset=8, out_types=[TensorProto.FLOAT, TensorProto.INT64]
    )
    _check("AveragePool", [x], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, opset=7, atol=1e-6)


@pytest.mark.parametrize("shape", [(2, 3, 11), (2, 3, 7, 8), (1, 2, 3, 4, 5)])
@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
def test_global_pools(op: str, shape: tuple[int, ...]) -> None:
    # GlobalMaxPool on 3-D input is one of the cases onnx.reference gets wrong
    _check(op, [_f(*shape)], atol=1e-5)
    if op == "GlobalLpPool":
        _check(op, [_f(*shape)], {"p": 3}, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", [(1, 200, 2, 96), (1, 8, 200, 200), (3, 5, 1, 1), (0, 4, 3, 3)])
def test_global_average_pool_as_a_gemv(shape: tuple[int, ...], dtype: Any) -> None:
    """float32 as one gemv (on one BLAS thread from 2^18 values on); float16 and an empty batch by mean."""
    x = np.random.default_rng(5).standard_normal(shape).astype(dtype) * 4 + 1
    _check("GlobalAveragePool", [x], atol=1e-2 if dtype == np.float16 else 1e-5)


def test_global_average_pool_float64_as_a_gemv() -> None:  # onnxruntime has no float64 kernel: numpy's mean
    x = np.random.default_rng(6).standard_normal((2, 7, 5, 9)) * 4 + 1
    model, feeds = _model("GlobalAveragePool", [x])
    (y,) = epctx.InferenceSession(model.SerializeToString()).run(None, feeds)
    assert y.dtype == np.float64 and y.shape == (2, 7, 1, 1)
    np.testing.assert_allclose(y, x.mean(axis=(2, 3), keepdims=True), rtol=1e-12, atol=1e-12)


def test_global_pool_rejects_rank2() -> None:
    model, feeds = _model("GlobalMaxPool", [_f(2, 3)])
    with pytest.raises(epctx.errors.InvalidArgument):
        epctx.InferenceSession(model.SerializeToString()).run(None, feeds)


# --------------------------------------------------------------------------------------------------------
# Normalization

BN_SHAPES = [(2, 3), (2, 3, 5), (2, 3, 4, 5), (1, 3, 2, 3, 4)]


def _bn_params(c: int) -> list[np.ndarray]:
    return [_f(c), _f(c), _f(c), RNG.random(c).astype(F32) + 0.1]


@pytest.mark.parametrize("const", [(), (1, 2, 3, 4)], ids=["runtime", "const"])
@pytest.mark.parametrize(
    ("opset", "attrs"),
    [
        (7, {}),
        (9, {"momentum": 0.8}),  # onnx.reference treats this as training; onnxruntime (and we) do inference
        (13, {"momentum": 0.8, "epsilon": 1e-3}),
        (14, {}),
        (15, {"training_mode": 0, "momentum": 0.5}),
    ],
)
@pytest.mark.parametrize("shape", BN_SHAPES)
def test_batch_norm_inference(shape: tuple[int, ...], opset: int, attrs: dict[str, Any], const: Any) -> None:
    _check(
        "BatchNormalization", [_f(*shape), *_bn_params(shape[1])], attrs, opset=opset, const=const, atol=1e-5
    )


@pytest.mark.parametrize(
    ("opset", "attrs", "n_out"),
    [
        (9, {"momentum": 0.8}, 5),
        (14, {"training_mode": 1}, 3),
        (15, {"training_mode": 1, "momentum": 0.3}, 3),
    ],
)
@pytest.mark.parametrize("shape", BN_SHAPES[1:])
def test_batch_norm_training(shape: tuple[int, ...], opset: int, attrs: dict[str, Any], n_out: int) -> None:
    inputs = [_f(*shape), *_bn_params(shape[1])]
    _check("BatchNormalization", inputs, attrs, opset=opset, out_types=[TensorProto.FLOAT] * n_out, atol=1e-5)


def test_batch_norm_spatial0() -> None:
    params = [_f(3, 4), _f(3, 4), _f(3, 4), RNG.random((3, 4)).astype(F32) + 0.1]
    _check("BatchNormalization", [_f(2, 3, 4), *params], {"spatial": 0}, opset=7, atol=1e-5)


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (2, 3, 4, 5)])
def test_layer_norm(shape: tuple[int, ...], with_bias: bool) -> None:
    x = _f(*shape)
    for axis in range(-len(shape), len(shape)):
        inputs = [x, _f(*shape[axis:])] + ([_f(*shape[axis:])] if with_bias else [])
        f = TensorProto.FLOAT
        _check("LayerNormalization", inputs, {"axis": axis}, opset=17, out_types=[f, f, f], atol=1e-5)
        _check("LayerNormalization", inputs, {"axis": axis, "epsilon": 1e-2}, opset=17, atol=1e-5)


@pytest.mark.parametrize(
    ("dtype", "elem"), [(np.float16, TensorProto.FLOAT16), (np.float64, TensorProto.DOUBLE)]
)
def test_layer_norm_dtypes(dtype: Any, elem: int) -> None:
    x = _f(2, 3, 8, dtype=dtype)
    f = TensorProto.FLOAT
    _check("LayerNormalization", [x, np.ones(8, dtype)], {}, opset=17, out_types=[elem, f, f], atol=2e-3)


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 3, 2, 3, 4)])
def test_instance_norm(shape: tuple[int, ...]) -> None:
    _check(
        "InstanceNormalization",
        [_f(*shape), _f(shape[1]), _f(shape[1])],
        {"epsilon": 1e-3},
        opset=6,
        atol=1e-5,
    )


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_group_norm(groups: int) -> None:
    x = _f(2, 4, 3, 5)
    _check(
        "GroupNormalization", [x, _f(4), _f(4)], {"num_groups": groups, "epsilon": 1e-3}, opset=21, atol=1e-5
    )


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (2, 3, 4, 5)])
def test_lp_norm(shape: tuple[int, ...], p: int) -> None:
    x = _f(*shape)
    x[0] = 0.0  # zero norm rows give zeros
    for axis in range(-len(shape), len(shape)):
        _check("LpNormalization", [x], {"axis": axis, "p": p}, opset=1, atol=1e-6)


# --------------------------------------------------------------------------------------------------------
# Resize / Upsample

X4 = _f(1, 2, 5, 7)
ROI = np.array([0, 0, 0.1, 0.2, 1, 1, 0.8, 0.9], F32)
SCALES = [[1, 1, 2, 2], [1, 1, 0.5, 0.6], [1, 1, 1.7, 0.8], [1, 1, 3, 1], [1, 1, 0.34, 2.5]]
SIZES = [[1, 2, 10, 14], [1, 2, 3, 4], [1, 2, 8, 5], [1, 2, 1, 1], [1, 2, 5, 9]]
COORDS = [
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
    "tf_crop_and_resize",
]
MODES: list[dict[str, Any]] = [
    *(
        {"mode": "nearest", "nearest_mode": nm}
        for nm in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
    ),
    {"mode": "linear"},
    {"mode": "cubic"},
    {"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5},
]


def _resize_opset(coord: str) -> int:
    return {"half_pixel_symmetric": 19, "tf_half_pixel_for_nn": 13}.get(coord, 19)


@pytest.mark.slow
@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(str(v) for v in m.values()))
def test_resize_modes(mode: dict[str, Any], coord: str) -> None:
    attrs = {**mode, "coordinate_transformation_mode": coord}
    roi = None
    if coord == "tf_crop_and_resize":
        attrs["extrapolation_value"] = -3.0
        roi = ROI
    opset = _resize_opset(coord)
    for sc in SCALES:
        _check("Resize", [X4, roi, np.array(sc, F32)], attrs, opset=opset, const=(1, 2), atol=1e-5)
    for sz in SIZES:
        _check("Resize", [X4, roi, None, np.array(sz, np.int64)], attrs, opset=opset, atol=1e-5)


@pytest.mark.parametrize("exclude", [0, 1])
@pytest.mark.parametrize("coord", ["half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias(mode: str, coord: str, exclude: int) -> None:
    attrs = {
        "mode": mode,
        "antialias": 1,
        "coordinate_transformation_mode": coord,
        "exclude_outside": exclude,
    }
    roi = ROI if coord == "tf_crop_and_resize" else None
    for sc in SCALES:
        _check("Resize", [X4, roi, np.array(sc, F32)], attrs, opset=18, atol=1e-5)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_axes_and_aspect_policy(mode: str, policy: str) -> None:
    attrs = {"mode": mode, "keep_aspect_ratio_policy": policy}
    _check("Resize", [X4, None, None, np.array([9, 4], np.int64)], {**attrs, "axes": [2, 3]}, opset=18)
    _check("Resize", [X4, None, None, np.array([4, 9], np.int64)], {**attrs, "axes": [3, 2]}, opset=18)
    _check("Resize", [X4, None, np.array([2.0, 0.5], F32)], {"mode": mode, "axes": [3, 2]}, opset=18)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_ranks_and_layouts(mode: str) -> None:
    cases = [
        (_f(6, 5), [1.5, 2]),
        (_f(2, 4, 5, 3), [1, 2, 1.5, 1]),  # NHWC-style scales
    ]
    if mode != "cubic":
        cases += [(_f(2, 6, 5), [1, 1.5, 2]), (_f(1, 2, 3, 4, 5), [1, 1, 1.5, 2, 0.6])]
    for x, sc in cases:
        _check("Resize", [x, None, np.array(sc, F32)], {"mode": mode}, opset=13, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int32, np.float16])
def test_resize_dtypes(dtype: Any) -> None:
    if dtype == np.uint8:
        x = RNG.integers(0, 255, (1, 2, 5, 7)).astype(dtype)
    else:
        x = (RNG.standard_normal((1, 2, 5, 7)) * 50).astype(dtype)
    # float16 results (values up to ~200) may round the other way from onnxruntime's: 2 ulp of float16 relative.
    tol = {"atol": 1e-2, "rtol": 2e-3} if dtype == np.float16 else {"atol": 1e-5}
    # Integer nearest and antialias are exact; plain integer linear can differ from onnxruntime by one unit
    # (it truncates a float sum whose evaluation order differs), so it is not asserted here.
    modes = [{"mode": "nearest"}, {"mode": "linear", "antialias": 1}, {"mode": "cubic", "antialias": 1}]
    if np.dtype(dtype).kind == "f":
        modes += [{"mode": "linear"}, {"mode": "cubic"}]
    for attrs, sc in itertools.product(modes, SCALES):
        _check("Resize", [x, None, np.array(sc, F32)], attrs, opset=18, **tol)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_legacy_and_upsample(mode: str) -> None:
    for sc in SCALES:
        _check("Resize", [X4, np.array(sc, F32)], {"mode": mode}, opset=10, atol=1e-5)
    for sc in ([1.0, 1.0, 2.0, 2.0], [1.0, 1.0, 1.7, 3.0], [1.0, 1.0, 3.0, 1.0]):
        _check("Upsample", [X4, np.array(sc, F32)], {"mode": mode}, opset=9, atol=1e-5)
        _check("Upsample", [X4], {"mode": mode, "scales": sc}, opset=7, atol=1e-5)


@pytest.mark.slow
def test_resize_nearest_halfway_sweep() -> None:
    """Nearest-pixel choices match onnxruntime across many size pairs (float32 coordinate arithmetic)."""
    for coord in ("asymmetric", "half_pixel", "half_pixel_symmetric", "tf_half_pixel_for_nn"):
        for nearest in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
            attrs = {"mode": "nearest", "coordinate_transformation_mode": coord, "nearest_mode": nearest}
            for n_in, n_out in itertools.product((3, 7, 11), (2, 5, 13)):
                x = np.arange(n_in, dtype=F32).reshape(1, n_in)
                _check("Resize", [x, None, None, np.array([1, n_out], np.int64)], attrs, opset=19)


@pytest.mark.parametrize(
    ("xs", "attrs"),
    [
        ((2, 32, 80, 104), {"pads": [1, 1, 1, 1]}),
        ((1, 64, 60, 200), {"pads": [2, 2, 2, 2], "strides": [2, 2]}),
    ],
    ids=["blocks", "phases"],
)
@pytest.mark.parametrize("form", ["native", "numpy"])
def test_depthwise_rows_shared_with_helper_threads(
    xs: tuple[int, ...], attrs: dict[str, Any], form: str, monkeypatch: pytest.MonkeyPatch, request: Any
) -> None:
    """A large depthwise conv splits its output rows over two runners: the numpy form's einsum bands between
    the caller and a helper thread (from 2^21 multiply-adds), the C loop's blocks among csrc/pool.c's workers:
    the same numbers as onnxruntime."""
    from epctx.providers.cpu import blas_serial, native, parallel

    calls: list[int] = []
    if form == "numpy":
        request.getfixturevalue("numpy_kernels")
        monkeypatch.setattr(blas_serial.serial(), "threads", lambda: 2)
        split = parallel.split_ranges

        def counted(count: int, block: Any, min_size: int = 1, per_runner: int = 4) -> None:
            calls.append(count)
            split(count, block, min_size, per_runner)

        monkeypatch.setattr(parallel, "split_ranges", counted)
    elif native.kernels() is None:
        pytest.skip("the native kernels are not built here")
    else:
        calls = request.getfixturevalue("native_shares")
    k = 3 if attrs["pads"][0] == 1 else 5
    ws = (xs[1], 1, k, k)
    _check(
        "Conv", [_f(*xs), _f(*ws), _f(ws[0])], {"group": xs[1], **attrs}, const=(1, 2), atol=1e-4, rtol=1e-4
    )
    assert calls and (form == "numpy" or calls[-1] == 2)
