"""``epctx demo`` on a kernel EP (no context model) and --keep (the files stay, their folder is printed)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.cli.helpers import Cli
from tests.epcontext.models import EXAMPLE


def _kept(out: str) -> Path:
    line = next(line for line in out.splitlines() if line.startswith("files kept in "))
    return Path(line[len("files kept in ") :].split(":")[0])


@pytest.mark.slow
def test_demo_on_the_cpu_ep(cli: Cli) -> None:
    result = cli("demo", "-p", "CPUExecutionProvider")
    assert result.status == 0, result.err
    assert "compiles nothing" in result.out and "max abs diff vs onnxruntime CPU" in result.out
    assert "MISMATCH" not in result.out


@pytest.mark.slow
def test_demo_keep_leaves_the_files(cli: Cli) -> None:
    result = cli("demo", "-p", EXAMPLE, "--keep")
    assert result.status == 0, result.err
    folder = _kept(result.out)
    try:
        names = {p.name for p in folder.iterdir()}
        assert names == {"demo_cnn.onnx", "demo_cnn_ctx.onnx", f"demo_cnn_{EXAMPLE}.bin"}
        assert cli("inspect", folder / "demo_cnn_ctx.onnx", "--verify").status == 0
    finally:
        shutil.rmtree(folder)


@pytest.mark.slow
def test_demo_without_keep_leaves_nothing(cli: Cli, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again
    assert cli("demo", "-p", EXAMPLE).status == 0
    assert list(tmp_path.iterdir()) == []
