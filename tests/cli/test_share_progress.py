"""``epctx share`` says what it compiles as ``compile`` does (stderr, model by model and partition by partition),
and ``-q`` silences it; the report on stdout is the same either way."""

from __future__ import annotations

import re
from pathlib import Path

import onnx
import pytest

from tests.cli.helpers import Cli
from tests.epcontext.models import EXAMPLE
from tests.epcontext.test_weight_sharing import _variant


@pytest.fixture
def models(tmp_path: Path) -> list[Path]:
    paths = [tmp_path / f"m{k}.onnx" for k in range(2)]
    for k, path in enumerate(paths):
        onnx.save(_variant(k), path)
    return paths


def test_share_shows_progress_per_model_and_partition(cli: Cli, models: list[Path]) -> None:
    result = cli("share", "-p", EXAMPLE, *models)
    assert result.status == 0, result.err
    lines = result.err.splitlines()
    assert all(line.startswith("epctx: ") for line in lines), result.err
    starts = [k for k, line in enumerate(lines) if re.match(r"epctx: model [12]/2: ", line)]
    assert [lines[k] for k in starts] == [
        f"epctx: model 1/2: {models[0]} -> {models[0].with_name('m0_ctx.onnx')}",
        f"epctx: model 2/2: {models[1]} -> {models[1].with_name('m1_ctx.onnx')}",
    ]
    compiled = [
        re.match(r"epctx: compiled partition (\d+)/(\d+) .* on (\w+), [0-9.]+ s ", line) for line in lines
    ]
    for first, end in zip(starts, [*starts[1:], len(lines)]):
        done = [m.groups() for m in compiled[first:end] if m]
        total = int(done[0][1])
        assert done == [(str(k), str(total), EXAMPLE) for k in range(1, total + 1)], result.err
    quiet = cli("share", "-p", EXAMPLE, *models, "--force", "-q")
    assert quiet.status == 0 and quiet.err == ""
    assert quiet.out.splitlines()[1:] == result.out.splitlines()[1:]  # the files written, as without -q
    assert cli("share", "-p", EXAMPLE, *models, "--force", "--json").err == ""
