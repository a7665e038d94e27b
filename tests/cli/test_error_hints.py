"""Errors and warnings that say what to do: a missing context binary (copy it beside the model, or recompile), a
context model loaded without the EP its nodes name (pass it), and an onnxruntime EP epctx lacks (CUDA): warned
once, not once through logging's last resort and again through ``warnings``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import epctx
from tests.cli.helpers import Cli, assert_one_error_line
from tests.epcontext.models import EXAMPLE

SRC = Path(__file__).resolve().parents[2] / "src"
SKIPPED = "Specified provider 'CUDAExecutionProvider' is not in available provider names"


def _python(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env
    )


def test_missing_binary_says_to_copy_it_or_recompile(cli: Cli, ctx_model: Path, tmp_path: Path) -> None:
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(ctx_model, moved)
    binary = f"model_{EXAMPLE}.bin"
    result = cli("run", moved / ctx_model.name, "--random", "--dim", "N=2")
    assert_one_error_line(
        result, 1, f"context binary '{binary}' is missing", f"copy '{binary}'", f"into '{moved}'", "compile"
    )
    shutil.copy(ctx_model.with_name(binary), moved)  # doing what it says works
    assert cli("run", moved / ctx_model.name, "--random", "--dim", "N=2").status == 0


def test_context_model_without_its_ep_says_which_to_pass(cli: Cli, ctx_model: Path) -> None:
    with pytest.raises(epctx.InvalidGraph) as info:
        epctx.InferenceSession(str(ctx_model))
    assert f"pass the EP that loads it: providers=['{EXAMPLE}']" in str(info.value)
    epctx.InferenceSession(str(ctx_model), providers=[EXAMPLE])  # doing what it says works
    result = cli("run", ctx_model, "-p", "cpu", "--random", "--dim", "N=2")
    assert_one_error_line(result, 1, f"made by '{EXAMPLE}'", f"-p {EXAMPLE} on the command line")


def test_missing_onnxruntime_ep_is_warned_once(model: Path) -> None:
    run = ("-m", "epctx.cli", "run", str(model), "--random", "--dim", "N=2", "-p", "CUDAExecutionProvider")
    done = _python(*run, cwd=model.parent)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("CUDAExecutionProvider' is not") == 1, done.stderr
    assert done.stderr.startswith(f"epctx run: warning: {SKIPPED}") and len(done.stderr.splitlines()) == 1
    compile_ = ("-m", "epctx.cli", "compile", str(model), "-p", "CUDAExecutionProvider", "-p", "example")
    done = _python(*compile_, cwd=model.parent)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("CUDAExecutionProvider' is not") == 1, done.stderr
    assert "epctx: compiled partition" in done.stderr  # the progress lines are still there
    script = f"import epctx; epctx.InferenceSession({str(model)!r}, providers=['CUDAExecutionProvider'])"
    done = _python("-c", script, cwd=model.parent)  # a plain script, logging not configured
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("CUDAExecutionProvider' is not") == 1 and "UserWarning" in done.stderr
    configured = textwrap.dedent(f"""
        import logging, epctx
        logging.basicConfig(format="LOG %(name)s %(message)s")
        epctx.InferenceSession({str(model)!r}, providers=['CUDAExecutionProvider'])
    """)
    done = _python("-c", configured, cwd=model.parent)  # logging configured: the record reaches it too
    assert f"LOG epctx {SKIPPED}" in done.stderr and "UserWarning" in done.stderr
