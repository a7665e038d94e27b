"""erf for the CPU kernels (Erf, Gelu): a Chebyshev approximation with constant coefficients, as fast as numpy
arithmetic and without scipy."""

from __future__ import annotations

import numpy as np

__all__ = ["erf"]


# erf(x) ~= x * T_c(2 x^2 / limit^2 - 1) on |x| <= limit: Chebyshev coefficients c fitted by least squares
# (np.polynomial.chebyshev.chebfit at 4 * degree + 64 Chebyshev nodes), stored as constants so that importing
# the CPU EP does no BLAS work (issue 7); tests/cpu/test_erf_coefficients.py re-derives and compares them.
# float32 (and narrower): |x| <= 4 (erfc(4) ~ 1.5e-8), degree 16 converted to monomials in t, highest power
# first, for Horner (all below 0.4, so Horner in float32 is stable): ~3e-7 relative. float64: |x| <= 6
# (erfc(6) ~ 2e-17), Clenshaw of degree 44.
_ERF32_LIMIT = 4.0
_ERF32_DEGREE = 16
_ERF32_HORNER = (
    0.0005964250760405544,
    -0.0013728150919252446,
    0.0006166107064264988,
    -0.0010769420974992994,
    0.0055773636942869085,
    -0.010085906983711531,
    0.01390814620087608,
    -0.02166253225456539,
    0.033217001104644164,
    -0.0460143213657504,
    0.05985599357852605,
    -0.07468753070210446,
    0.09021204267260763,
    -0.10771336119337308,
    0.13167500145685612,
    -0.17657617187695768,
    0.35353099636156904,
)
_ERF32 = [np.float32(c) for c in _ERF32_HORNER]
_ERF64_LIMIT = 6.0
_ERF64_DEGREE = 44
_ERF64 = np.array(
    [
        0.3674498180429922,
        -0.3134656066710444,
        0.18068036754729247,
        -0.10948259780540122,
        0.06650028321506797,
        -0.03976284161522614,
        0.023194768790993376,
        -0.013132045071459814,
        0.007193664033012386,
        -0.003805440047020393,
        0.0019417349790359253,
        -0.0009550486382426148,
        0.0004526814560034558,
        -0.00020677121401630548,
        9.103378630425243e-05,
        -3.864376344861928e-05,
        1.5824027438643246e-05,
        -6.253838171503066e-06,
        2.386845548771821e-06,
        -8.802851958636263e-07,
        3.139269266644465e-07,
        -1.083256356826505e-07,
        3.6193117155297243e-08,
        -1.1716764393951545e-08,
        3.677641816651296e-09,
        -1.1199561404789588e-09,
        3.3112100764588646e-10,
        -9.510575671206154e-11,
        2.6553979750323718e-11,
        -7.211639076211984e-12,
        1.9060483321596087e-12,
        -4.908313028784601e-13,
        1.2286046831129028e-13,
        -3.030245618758494e-14,
        7.0806793555386514e-15,
        -1.7893989080730637e-15,
        2.261837448374384e-16,
        -7.510727185860072e-17,
        -1.455066551613924e-16,
        -4.0833855997992164e-17,
        -3.7555582930717765e-17,
        -5.4180861884634647e-17,
        -2.9656272769273847e-16,
        -4.496353541757644e-16,
        4.877967284107881e-16,
    ]
)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function elementwise (numpy has none); keeps float16/float32/float64."""
    dtype = x.dtype
    if dtype == np.float64:
        xc = np.clip(x, -_ERF64_LIMIT, _ERF64_LIMIT)
        t = xc * xc * (2.0 / (_ERF64_LIMIT * _ERF64_LIMIT)) - 1.0
        return np.asarray(xc * np.polynomial.chebyshev.chebval(t, _ERF64))
    xc = np.clip(x.astype(np.float32, copy=False), np.float32(-_ERF32_LIMIT), np.float32(_ERF32_LIMIT))
    t = xc * xc
    t *= np.float32(2.0 / (_ERF32_LIMIT * _ERF32_LIMIT))
    t -= np.float32(1.0)
    r = np.full_like(t, _ERF32[0])
    for c in _ERF32[1:]:
        r *= t
        r += c
    r *= xc
    return r if dtype == np.float32 else r.astype(dtype)
