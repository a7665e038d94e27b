"""GlobalAveragePool laid out once per input shape, strides and dtype (kernels/pool.py ``_GemvPool``): a gemv for
contiguous and channels-last float inputs, numpy's mean for the rest; every layout, called again, gives the
same numbers as numpy's mean, whatever came before it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from epctx.providers.cpu.kernels import pool
from epctx.providers.cpu.registry import find_factory

RNG = np.random.default_rng(7)


def _layouts() -> list[tuple[str, np.ndarray, bool]]:
    """(name, input, whether it takes the gemv)."""
    base = RNG.standard_normal((2, 12, 9, 10)).astype(np.float32)
    last = np.ascontiguousarray(base.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    return [
        ("contiguous", base, True),
        ("channels_last", last, True),
        ("strided", base[:, :, ::2], False),
        ("float64", base.astype(np.float64), True),
        ("float16", base.astype(np.float16), False),
        ("rank3", np.ascontiguousarray(base[:, :, 0]), True),
        ("rank5", base[..., None], True),
        ("empty", base[:0], False),
        ("large_gated", RNG.standard_normal((1, 64, 64, 70)).astype(np.float32), True),
    ]


def test_every_layout_twice_in_any_order() -> None:
    run = find_factory("", "GlobalAveragePool", 1)(None)  # type: ignore[misc, arg-type]
    layouts = _layouts()
    for order in (layouts, layouts[::-1], layouts):
        for name, x, _ in order:
            (y,) = run(x)
            expected = x.mean(axis=tuple(range(2, x.ndim)), keepdims=True)
            assert y.shape == expected.shape and y.dtype == x.dtype, name
            tol = 2e-3 if x.dtype == np.float16 else 1e-5
            np.testing.assert_allclose(y, expected, rtol=tol, atol=tol * 1e-2, err_msg=name)


@pytest.mark.parametrize("case", range(len(_layouts())))
def test_which_layouts_take_the_gemv(case: int) -> None:
    name, x, gemv = _layouts()[case]
    how = pool._GemvPool.of(x, gate=None)
    assert (how is not None) is gemv, name
    if how is not None:
        assert (how.last is None) is x.flags.c_contiguous


def test_a_large_input_runs_its_gemv_through_the_one_thread_gate() -> None:
    calls: list[Any] = []

    def gate(fn: Any, *args: Any) -> Any:
        calls.append(fn)
        return fn(*args)

    big, small = (RNG.standard_normal(s).astype(np.float32) for s in [(1, 64, 64, 70), (1, 8, 4, 4)])
    for x, gated in ((big, True), (small, False)):
        calls.clear()
        how = pool._GemvPool.of(x, gate)
        assert how is not None
        np.testing.assert_allclose(how.pool(x), x.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)
        assert bool(calls) is gated
