"""The erf coefficients stored in the CPU EP are what a Chebyshev fit gives (kept as constants: no BLAS at import)."""

from __future__ import annotations

import math

import numpy as np

from epctx.providers.cpu.kernels import erf as ew


def _erf_fit(limit: float, degree: int) -> np.ndarray:
    """Chebyshev coefficients c of erf(x) ~= x * T_c(2 x^2 / limit^2 - 1) on |x| <= limit."""
    n = 4 * degree + 64
    t = np.cos(np.pi * (np.arange(n) + 0.5) / n)
    x = np.sqrt((t + 1.0) * (limit * limit / 2.0)).tolist()
    f = np.array([math.erf(v) / v if v > 0 else 2.0 / math.sqrt(math.pi) for v in x])
    return np.asarray(np.polynomial.chebyshev.chebfit(t, f, degree))


def test_float32_coefficients_rederived() -> None:
    fit = _erf_fit(ew._ERF32_LIMIT, ew._ERF32_DEGREE)
    horner = np.polynomial.chebyshev.cheb2poly(fit)[::-1]
    assert len(ew._ERF32_HORNER) == len(horner) == ew._ERF32_DEGREE + 1
    # The least-squares solve may differ in the last bits between BLAS builds and thread counts.
    np.testing.assert_allclose(ew._ERF32_HORNER, horner, rtol=1e-10, atol=1e-14)
    assert [float(c) for c in ew._ERF32] == [float(np.float32(c)) for c in ew._ERF32_HORNER]


def test_float64_coefficients_rederived() -> None:
    fit = _erf_fit(ew._ERF64_LIMIT, ew._ERF64_DEGREE)
    assert ew._ERF64.shape == fit.shape == (ew._ERF64_DEGREE + 1,)
    assert ew._ERF64.dtype == np.float64
    np.testing.assert_allclose(ew._ERF64, fit, rtol=0, atol=1e-14)


def test_erf_accuracy() -> None:
    x = np.linspace(-7.0, 7.0, 20001)
    want = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(ew.erf(x), want, rtol=0, atol=5e-14)
    got32 = ew.erf(x.astype(np.float32)).astype(np.float64)
    np.testing.assert_allclose(got32, want, rtol=1e-6, atol=2e-7)
