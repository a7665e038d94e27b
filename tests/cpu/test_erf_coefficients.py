"""The erf constants of the CPU EP do what they are for: erf within a few ulp of the true value, in every dtype.

The coefficients are the result of a least-squares Chebyshev fit, kept as constants (no BLAS at import). The last
bits of a least-squares solve depend on the BLAS kernel OpenBLAS picks for the CPU and on its thread count, so the
accuracy tests below check the shipped constants against ``math.erf`` / ``scipy.special.erf`` (not against one
solve), and the re-derivation compares the fitted *function* with a tolerance that any backward-stable solver
meets (the Chebyshev matrix at Chebyshev nodes is well conditioned, so a correct BLAS moves the result by a few
ulp of the coefficients' norm, far below the fit's own error).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from epctx.providers.cpu.kernels import erf as ew


def _ulp_error(got: np.ndarray, want: np.ndarray, dtype: type) -> np.ndarray:
    """|got - want| in units of the spacing of ``want`` rounded to ``dtype`` (subnormal spacing near 0)."""
    spacing = np.spacing(np.abs(want.astype(dtype))).astype(np.float64)
    spacing = np.maximum(spacing, float(np.finfo(dtype).smallest_subnormal))
    return np.abs(got.astype(np.float64) - want) / spacing


def test_float64_within_bound_of_math_erf() -> None:
    x = np.linspace(-7.0, 7.0, 40001)
    tiny = np.geomspace(1e-300, 1.0, 601)
    x = np.concatenate([x, tiny, -tiny, [0.0, -0.0, 5.99, 6.0, 6.01]])
    want = np.array([math.erf(v) for v in x])
    got = ew.erf(x)
    assert got.dtype == np.float64
    # The degree-44 fit is good to ~3e-14 absolute (~240 ulp where |erf| is near 1); near 0 within 32 ulp (4e-15 relative).
    np.testing.assert_allclose(got, want, rtol=0, atol=5e-14)
    small = np.abs(x) < 0.5
    assert _ulp_error(got[small], want[small], np.float64).max() <= 32


@pytest.mark.slow
def test_float32_within_5_ulp_over_a_dense_sample_of_all_floats() -> None:
    special = pytest.importorskip("scipy.special")
    # Every 97th float32 bit pattern from +0 to 5.0 (11 million values, subnormals included), both signs.
    bits = np.arange(0, 0x40A00000, 97, dtype=np.uint32)
    x = bits.view(np.float32)
    for xs in (x, -x):
        got = ew.erf(xs)
        assert got.dtype == np.float32
        want = special.erf(xs.astype(np.float64))
        err = _ulp_error(got, want, np.float32)
        assert err.max() <= 5.0, (err.max(), xs[err.argmax()])
    # Past the fit's limit erf rounds to +-1 in float32.
    big = np.array([4.0, 4.5, 9.0, 1e30, np.inf], dtype=np.float32)
    np.testing.assert_array_equal(ew.erf(big), np.float32(1.0))
    np.testing.assert_array_equal(ew.erf(-big), np.float32(-1.0))


def test_float16_within_1_ulp_for_every_value() -> None:
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    h = h[np.isfinite(h)]
    got = ew.erf(h)
    assert got.dtype == np.float16
    want = np.array([math.erf(float(v)) for v in h])
    err = _ulp_error(got, want, np.float16)
    assert err.max() <= 1.0, (err.max(), h[err.argmax()])


def test_nan_propagates() -> None:
    for dtype in (np.float16, np.float32, np.float64):
        assert np.isnan(ew.erf(np.array([np.nan], dtype=dtype)))[0]


def _erf_fit(limit: float, degree: int) -> np.ndarray:
    """Chebyshev coefficients c of erf(x) ~= x * T_c(2 x^2 / limit^2 - 1) on |x| <= limit."""
    n = 4 * degree + 64
    t = np.cos(np.pi * (np.arange(n) + 0.5) / n)
    x = np.sqrt((t + 1.0) * (limit * limit / 2.0)).tolist()
    f = np.array([math.erf(v) / v if v > 0 else 2.0 / math.sqrt(math.pi) for v in x])
    return np.asarray(np.polynomial.chebyshev.chebfit(t, f, degree))


def _solver_tolerance(coefficients: np.ndarray) -> float:
    """What any backward-stable least-squares solve may move the fitted function by, at any point of [-1, 1]."""
    return 64 * float(np.finfo(np.float64).eps) * float(np.abs(coefficients).sum())


_T = np.linspace(-1.0, 1.0, 4001)


def test_float32_constants_are_the_fit() -> None:
    fit = _erf_fit(ew._ERF32_LIMIT, ew._ERF32_DEGREE)
    assert len(ew._ERF32_HORNER) == ew._ERF32_DEGREE + 1
    shipped = np.polyval(np.array(ew._ERF32_HORNER), _T)
    refit = np.polynomial.chebyshev.chebval(_T, fit)
    # cheb2poly and Horner round too: allow their error on top of the solver's (still 1e-5 of the fit's error).
    assert np.abs(shipped - refit).max() <= _solver_tolerance(fit) + 1e-12
    assert [float(c) for c in ew._ERF32] == [float(np.float32(c)) for c in ew._ERF32_HORNER]


def test_float64_constants_are_the_fit() -> None:
    fit = _erf_fit(ew._ERF64_LIMIT, ew._ERF64_DEGREE)
    assert ew._ERF64.shape == fit.shape == (ew._ERF64_DEGREE + 1,)
    assert ew._ERF64.dtype == np.float64
    shipped = np.polynomial.chebyshev.chebval(_T, ew._ERF64)
    refit = np.polynomial.chebyshev.chebval(_T, fit)
    assert np.abs(shipped - refit).max() <= _solver_tolerance(fit)
