"""MaxPool without a padded copy (providers/cpu/kernels/pool_max.py): the same numbers as a brute-force window
maximum over a -inf padded input on a sweep of geometries (onnxruntime on the shapes networks use:
``test_conv_fewer_passes.MAX_POOLS``), and which form each shape takes."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from epctx.providers.cpu.kernels.pool_max import UnpaddedMax
from epctx.providers.cpu.kernels.windows import spatial_geometry

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


def _geometry(case: Any) -> Any:
    x_shape, kernel, strides, pads = case
    rank = len(kernel)
    return spatial_geometry(
        x_shape[2:], kernel, strides, [1] * rank, pads, "NOTSET", ceil_mode=False, node="p"
    )


# the sweep's geometries this form takes (the others, a window of padding only or its last position past the row,
# run the padded form)
FITTING = [case for case in _cases() if UnpaddedMax.fits(_geometry(case), case[0][2:])]


@pytest.mark.parametrize("case", FITTING, ids=lambda c: f"{c[0][2:]}-k{c[1]}-s{c[2]}-p{c[3]}")
def test_unpadded_max_matches_a_brute_force_window_maximum(case: Any) -> None:
    x_shape, kernel, strides, pads = case
    geo = _geometry(case)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    y = UnpaddedMax(geo, x_shape[2:])(x)
    assert y.shape == x_shape[:2] + geo.out and y.dtype == x.dtype and y.flags.c_contiguous
    np.testing.assert_array_equal(y, _brute(x, kernel, strides, pads, geo.out).astype(np.float32))


def test_most_of_the_sweep_takes_the_unpadded_form() -> None:
    assert len(FITTING) >= len(_cases()) * 3 // 4, (len(FITTING), len(_cases()))


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
