"""MaxPool without a padded copy (providers/cpu/kernels/pool_max.py): the same numbers as a brute-force window
maximum over a -inf padded input on a sweep of geometries, and as onnxruntime on the shapes networks use."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from onnx import helper

import epctx
from epctx.providers.cpu.kernels.pool_max import UnpaddedMax
from epctx.providers.cpu.kernels.windows import spatial_geometry
from tests.oracle import run_ort

RNG = np.random.default_rng(2911)


def _brute(
    x: np.ndarray, kernel: list[int], strides: list[int], pads: list[int], out: tuple[int, ...]
) -> Any:
    rank = len(kernel)
    padded = np.pad(
        x.astype(np.float64),
        [(0, 0), (0, 0)] + [(pads[i], pads[i + rank]) for i in range(rank)],
        constant_values=-np.inf,
    )
    y = np.full(x.shape[:2] + out, -np.inf)
    for o in itertools.product(*(range(n) for n in out)):
        window = tuple(slice(o[i] * strides[i], o[i] * strides[i] + kernel[i]) for i in range(rank))
        y[(slice(None), slice(None), *o)] = padded[(slice(None), slice(None), *window)].max(
            axis=tuple(range(2, 2 + rank))
        )
    return y


def _cases() -> list[tuple[tuple[int, ...], list[int], list[int], list[int]]]:
    cases = []
    for spatial in [(7,), (9, 8), (13, 6), (5, 6, 7), (2, 3), (1, 9)]:
        rank = len(spatial)
        for k, s in itertools.product((1, 2, 3, 5), (1, 2, 3)):
            for p in sorted({0, k // 2, k - 1}):
                kernel, strides = [min(k, n + p) for n in spatial], [s] * rank
                pads = [p] * rank + [max(0, p - 1)] * rank  # asymmetric: one less at the end
                cases.append(((2, 3, *spatial), kernel, strides, pads))
    return cases


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c[0][2:]}-k{c[1]}-s{c[2]}-p{c[3]}")
def test_unpadded_max_matches_a_brute_force_window_maximum(case: Any) -> None:
    x_shape, kernel, strides, pads = case
    rank = len(kernel)
    geo = spatial_geometry(
        x_shape[2:], kernel, strides, [1] * rank, pads, "NOTSET", ceil_mode=False, node="p"
    )
    if not UnpaddedMax.fits(geo, x_shape[2:]):
        pytest.skip("a window of padding only, or its last position past the row: the padded form runs")
    x = RNG.standard_normal(x_shape).astype(np.float32)
    y = UnpaddedMax(geo, x_shape[2:])(x)
    assert y.shape == x_shape[:2] + geo.out and y.dtype == x.dtype and y.flags.c_contiguous
    np.testing.assert_array_equal(y, _brute(x, kernel, strides, pads, geo.out).astype(np.float32))


def test_most_of_the_sweep_takes_the_unpadded_form() -> None:
    taken = 0
    for x_shape, kernel, strides, pads in _cases():
        rank = len(kernel)
        geo = spatial_geometry(
            x_shape[2:], kernel, strides, [1] * rank, pads, "NOTSET", ceil_mode=False, node="p"
        )
        taken += UnpaddedMax.fits(geo, x_shape[2:])
    assert taken >= len(_cases()) * 3 // 4, (taken, len(_cases()))


@pytest.mark.parametrize(
    ("x_shape", "attrs"),
    [
        ((1, 64, 112, 112), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4}),  # ResNet's stem
        ((1, 32, 20, 20), {"kernel_shape": [5, 5], "pads": [2] * 4}),  # YOLO's SPPF
        ((1, 16, 15, 15), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
        ((1, 8, 11, 11), {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"}),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_max_pools_of_networks_match_onnxruntime(
    x_shape: tuple[int, ...], attrs: dict[str, Any], dtype: Any
) -> None:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["y"], **attrs)],
        "g",
        [helper.make_tensor_value_info("x", elem, list(x_shape))],
        [helper.make_tensor_value_info("y", elem, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)], ir_version=8)
    if dtype == np.float32:
        x = RNG.standard_normal(x_shape).astype(dtype)
    else:
        x = RNG.integers(-128, 127, x_shape, endpoint=True).astype(dtype)
    sess = epctx.InferenceSession(model.SerializeToString())
    theirs = run_ort(model, {"x": x})[0]
    for _ in range(2):
        ours = sess.run(None, {"x": x})[0]
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape and math.prod(ours.shape) > 0
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize(
    ("x_shape", "kernel", "strides", "pads", "pays"),
    [
        ((1, 64, 112, 112), [3, 3], [2, 2], [1] * 4, True),  # ResNet's stem: 1281 -> 681 us measured
        ((1, 128, 20, 20), [5, 5], [1, 1], [2] * 4, False),  # stride 1: whole flattened rows padded
        ((1, 64, 160, 160), [2, 2], [2, 2], [0] * 4, False),  # no padding: the padded form copies nothing
        ((2, 16, 15, 16), [3, 3], [2, 2], [1] * 4, False),  # small: fewer calls win
    ],
)
def test_the_unpadded_form_is_taken_where_it_pays(
    x_shape: tuple[int, ...], kernel: list[int], strides: list[int], pads: list[int], pays: bool
) -> None:
    geo = spatial_geometry(x_shape[2:], kernel, strides, [1, 1], pads, "NOTSET", ceil_mode=False, node="p")
    assert UnpaddedMax.pays(geo, x_shape) is pays
