"""Fixtures of the command-line tests: small models made with onnx.helper, and ``epctx.cli.main`` run
in-process with its exit status, stdout and stderr."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest

from epctx.cli import main
from tests.cli.helpers import Cli, Result
from tests.epcontext.models import EXAMPLE, two_partition_model


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    def call(*args: Any) -> Result:
        capsys.readouterr()
        status = main([str(a) for a in args])
        captured = capsys.readouterr()
        return Result(status, captured.out, captured.err)

    return call


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """x[N, 8] -> y[N, 4]: two Example-EP partitions around a CPU LayerNormalization."""
    path = tmp_path / "model.onnx"
    onnx.save(two_partition_model(), path)
    return path


@pytest.fixture
def ctx_model(model: Path, cli: Cli) -> Path:
    """``model`` compiled by the Example EP: model_ctx.onnx + model_ExampleExecutionProvider.bin."""
    assert cli("compile", model, "-p", EXAMPLE, "-q").status == 0
    return model.with_name("model_ctx.onnx")
