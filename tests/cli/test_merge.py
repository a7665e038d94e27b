"""``epctx merge`` refuses to overwrite without --force and never creates a folder."""

from __future__ import annotations

from pathlib import Path

import onnx

from tests.cli.helpers import Cli, assert_one_error_line
from tests.epcontext.models import EXAMPLE
from tests.epcontext.test_multi_ep_merge import _second_stage


def _two_context_models(cli: Cli, model: Path) -> list[Path]:
    second = model.with_name("second.onnx")
    onnx.save(_second_stage(), second)
    assert cli("compile", model, "-p", EXAMPLE, "--prefix", "a_", "-q").status == 0
    assert cli("compile", second, "-p", EXAMPLE, "--prefix", "b_", "-q").status == 0
    return [model.with_name("model_ctx.onnx"), model.with_name("second_ctx.onnx")]


def test_merge_refuses_to_overwrite_without_force(cli: Cli, model: Path, tmp_path: Path) -> None:
    parts = _two_context_models(cli, model)
    merged = tmp_path / "merged.onnx"
    merged.write_bytes(b"keep me")
    assert_one_error_line(cli("merge", *parts, "-o", merged), 1, "merged.onnx", "--force")
    assert merged.read_bytes() == b"keep me"
    result = cli("merge", *parts, "-o", merged, "--force", "--json")
    assert result.status == 0, result.err
    assert result.json()["ep_context_nodes"] == 3
    assert sum(n.op_type == "EPContext" for n in onnx.load(merged).graph.node) == 3


def test_merge_into_a_missing_folder_is_an_error(cli: Cli, model: Path, tmp_path: Path) -> None:
    parts = _two_context_models(cli, model)
    assert_one_error_line(cli("merge", *parts, "-o", tmp_path / "new" / "m.onnx"), 1, "does not exist")
    assert not (tmp_path / "new").exists()
