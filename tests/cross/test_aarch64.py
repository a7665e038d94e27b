"""A context model cross-compiled here for aarch64 runs under qemu-aarch64 through epctx's own loader and matches
onnxruntime on this machine (issue 9). Needs the emulation setup that ``make cross-test`` builds
(``scripts/cross/setup_aarch64.sh``: qemu-user and an aarch64 Python sysroot in build/cross-aarch64); skipped
without it, and without the IREE EP."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import epctx

# Compiles with IREE, exports with torch or runs many whole models: `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SYSROOT = ROOT / "build" / "cross-aarch64"


def test_a_context_model_compiled_for_aarch64_runs_under_emulation(tmp_path: Path) -> None:
    if shutil.which("qemu-aarch64") is None or not (SYSROOT / ".ready").exists():
        pytest.skip(
            "no aarch64 emulation setup: run `make cross-test` (or scripts/cross/setup_aarch64.sh) first"
        )
    if "IREEExecutionProvider" not in epctx.get_available_providers():
        pytest.skip("the IREE EP is not available (pip install 'epctx[iree]')")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cross" / "run_aarch64.py"), "--models", "mlp",
         "--workdir", str(tmp_path), "--sysroot", str(SYSROOT)],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "refused on x86-64" in done.stdout and "OK" in done.stdout
