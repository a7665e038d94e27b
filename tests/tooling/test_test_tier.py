"""The test tiers: `make test-fast` leaves out what the `slow` marker carries, and a hang fails with a stack."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pytest(*args: str, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_a_hanging_test_fails_with_every_threads_stack(tmp_path: Path) -> None:
    (tmp_path / "test_hang.py").write_text(
        "import threading\n\ndef test_hangs():\n    threading.Event().wait()\n", encoding="utf-8"
    )
    # The project's own settings (timeout method) with a short timeout; rootdir is the repository's.
    done = _pytest(
        "-q", "-n", "0", "--timeout=2", "-c", str(ROOT / "pyproject.toml"), str(tmp_path / "test_hang.py")
    )
    assert done.returncode != 0
    text = done.stdout + done.stderr
    assert "Timeout" in text and "test_hangs" in text and "threading.Event().wait()" in text, text[-3000:]


_COLLECT = """
import sys, pytest
class Report:
    def pytest_collection_finish(self, session):
        print("HEAVY", [m for m in ("torch", "iree.compiler") if m in sys.modules])
sys.exit(pytest.main(sys.argv[1:], plugins=[Report()]))
"""


def test_the_fast_tier_leaves_out_iree_compiles_and_torch() -> None:
    """Collected for `make test-fast`: no IREE / torch test, and collecting imports neither package."""
    args = ["-p", "no:cacheprovider", "--collect-only", "-q", "-m", "not slow"]
    paths = ["tests/providers", "tests/cli", "tests/test_onnx_backend.py"]
    done = subprocess.run(
        [sys.executable, "-c", _COLLECT, *args, *paths], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:]
    collected = done.stdout
    assert "HEAVY []" in collected, [line for line in collected.splitlines() if "HEAVY" in line]
    assert "test_iree_ep.py" not in collected and "test_iree_llm_pair.py" not in collected
    assert "test_iree_logging.py" not in collected
    assert "OnnxBackendRealModelTest" not in collected and "OnnxBackendNodeModelTest" in collected
    # The capability tests stand in for IREE's compiles: they stay in the fast tier.
    assert "test_iree_capability.py" in collected
