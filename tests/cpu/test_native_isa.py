"""The native kernels as each instruction set runs them. The installed library holds AVX-512, AVX2 + FMA and
baseline code and the loader picks the one for this CPU, so a machine runs one of the three; here each is built
alone (``EPCTX_ONE_ISA`` with ``-march=x86-64``, ``-v3`` and, where this CPU has AVX-512, ``-v4``) with the C
compiler and served in place of the installed one: depthwise and dense convs (inner columns, borders, channel
tails), their activations (SiLU's polynomial exp among them) and the pool give onnxruntime's numbers."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from epctx.providers.cpu import native
from tests.cpu.test_conv_native import _model as dense_model
from tests.cpu.test_depthwise_native import _model as depthwise_model
from tests.oracle import assert_matches_ort

CSRC = Path(__file__).resolve().parents[2] / "csrc"
RNG = np.random.default_rng(17)

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None or platform.machine() not in ("x86_64", "AMD64") or native.kernels() is None,
    reason="needs a C compiler, x86-64 and the installed kernels",
)


def _cpu_has_avx512() -> bool:
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


LEVELS = ["x86-64", "x86-64-v3", *(["x86-64-v4"] if _cpu_has_avx512() else [])]


@pytest.fixture(scope="module", params=LEVELS)
def isa(request: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The kernels built for one instruction set, served by ``native.kernels`` for the module's tests."""
    out = tmp_path_factory.mktemp("isa") / f"kernels-{request.param}.so"
    sources = sorted(str(p) for p in CSRC.glob("*.c"))
    command = ["cc", "-O3", "-std=gnu11", "-fPIC", "-shared", f"-march={request.param}", "-DEPCTX_ONE_ISA"]
    subprocess.run(
        [*command, "-Wno-psabi", "-I", str(CSRC), *sources, "-o", str(out), "-lpthread"], check=True
    )
    before = native.kernels()
    native.use(native.bind(str(out)))
    assert native.kernels() is not None and native.kernels().path == str(out)  # type: ignore[union-attr]
    yield request.param
    native.use(before)


@pytest.mark.parametrize(
    ("x_shape", "kernel", "activation", "attrs"),
    [
        ((1, 16, 30, 30), (3, 3), "relu", {"pads": [1] * 4}),
        ((2, 37, 17, 13), (5, 5), "silu", {"pads": [2, 1, 0, 2], "strides": [2, 1]}),
        ((1, 72, 14, 14), (3, 3), "hardswish", {"pads": [1] * 4, "dilations": [2, 2], "strides": [1, 2]}),
        ((1, 8, 9, 9), (3, 3), "relu6", {"pads": [1] * 4}),
        ((1, 64, 48, 48), (3, 3), "hardsigmoid", {"pads": [1] * 4}),  # shared by the pool
    ],
)
def test_depthwise(
    isa: str, x_shape: tuple[int, ...], kernel: tuple[int, int], activation: str, attrs: Any
) -> None:
    model = depthwise_model(x_shape, kernel, activation, **attrs)
    assert_matches_ort(
        model, {"x": (RNG.standard_normal(x_shape) * 3).astype(np.float32)}, atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "activation", "attrs"),
    [
        ((1, 3, 64, 64), (16, 3, 3, 3), "silu", {"pads": [1] * 4, "strides": [2, 2]}),  # eight pixels a step
        ((1, 16, 21, 19), (48, 16, 3, 3), "relu", {"pads": [1, 0, 2, 1]}),  # two channel passes, a tail
        ((2, 5, 12, 12), (7, 5, 2, 3), "hardswish", {"dilations": [2, 1], "strides": [1, 2]}),
        ((1, 40, 20, 20), (33, 40, 1, 1), "none", {}),  # a 1x1 conv
        ((1, 64, 30, 31), (64, 64, 3, 3), "silu", {"pads": [1] * 4}),  # 12, 8 (AVX-512) and 4 pixels a step
        ((1, 128, 10, 10), (96, 128, 3, 3), "relu", {"pads": [1, 1, 0, 2]}),  # deep: 8 pixels, then 4 and 1
        ((1, 96, 20, 20), (40, 96, 1, 1), "none", {"strides": [2, 2]}),  # a strided 1x1 conv, a channel tail
    ],
)
def test_dense(
    isa: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...], activation: str, attrs: Any
) -> None:
    model = dense_model(x_shape, w_shape, activation, **attrs)
    assert_matches_ort(
        model, {"x": (RNG.standard_normal(x_shape) * 3).astype(np.float32)}, atol=2e-5, rtol=1e-5
    )
