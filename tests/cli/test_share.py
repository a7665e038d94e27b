"""``epctx share``: -o/--output-dir, --force, --json, and the command line of onnxruntime's
ep_weight_sharing_ctx_gen (-e, -i "k|v ...", -C "k|v ...", -p FILE.json, models separated by commas)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import epctx
from epctx.testing import no_compile
from tests.cli.helpers import Cli, assert_one_error_line
from tests.epcontext.models import EXAMPLE, feed
from tests.epcontext.test_weight_sharing import _variant
from tests.oracle import run_ort

PLUGIN = Path(__file__).resolve().parents[1] / "fixtures" / "plugin_ep" / "plugin_ep.py"


@pytest.fixture
def models(tmp_path: Path) -> list[Path]:
    paths = []
    for k in range(2):
        path = tmp_path / f"m{k}.onnx"
        onnx.save(_variant(k), path)
        paths.append(path)
    return paths


def _check_runs(ctx_models: list[Path], ep: str) -> None:
    for k, path in enumerate(ctx_models):
        with no_compile():
            sess = epctx.InferenceSession(str(path), providers=[ep])
        np.testing.assert_allclose(sess.run(None, feed())[0], run_ort(_variant(k), feed())[0], atol=1e-5)


def test_ort_tool_command_line(cli: Cli, models: list[Path]) -> None:
    """ep_weight_sharing_ctx_gen -e EP -i "k|v" -C "k|v" m1.onnx,m2.onnx: the same files the tool writes."""
    joined = ",".join(map(str, models))
    result = cli("share", "-e", "example", "-i", "ops|MatMul,Relu,Add,Sigmoid", "-C",
                 "ep.context_node_name_prefix|_part1", joined)  # fmt: skip
    assert result.status == 0, result.err
    folder = models[0].parent
    produced = {p.name for p in folder.iterdir()} - {m.name for m in models}
    assert produced == {"m0_ctx.onnx", "m1_ctx.onnx", f"m0_{EXAMPLE}.bin"}
    for ctx in ("m0_ctx.onnx", "m1_ctx.onnx"):
        names = [n.name for n in onnx.load(folder / ctx).graph.node if n.op_type == "EPContext"]
        assert names and all(n.startswith("_part1") for n in names)
    _check_runs([folder / "m0_ctx.onnx", folder / "m1_ctx.onnx"], EXAMPLE)


def test_output_dir_force_and_json(cli: Cli, models: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    with no_compile():
        assert_one_error_line(cli("share", "-p", EXAMPLE, *models, "-o", out), 1, "does not exist", "mkdir")
    assert not out.exists()
    out.mkdir()
    result = cli("share", "-p", EXAMPLE, *models, "--output-dir", out, "--json")
    assert result.status == 0, result.err
    report = result.json()
    assert report["ep"] == EXAMPLE
    assert sorted(Path(p).name for p in report["files"]) == sorted(
        ["m0_ctx.onnx", "m1_ctx.onnx", f"m0_{EXAMPLE}.bin"]
    )
    assert all(Path(p).parent == out for p in report["files"])
    assert {p.name for p in models[0].parent.iterdir()} == {"m0.onnx", "m1.onnx", "out"}
    with no_compile():  # refused before compiling
        assert_one_error_line(cli("share", "-p", EXAMPLE, *models, "-o", out), 1, "exists", "--force")
    assert cli("share", "-p", EXAMPLE, *models, "-o", out, "--force").status == 0
    _check_runs([out / "m0_ctx.onnx", out / "m1_ctx.onnx"], EXAMPLE)


def test_ignored_session_entries_are_said(cli: Cli, models: list[Path]) -> None:
    result = cli("share", "-e", "ExampleExecutionProvider", "-C", "ep.context_embed_mode|1", *models)
    assert result.status == 0
    assert "ep.context_embed_mode ignored" in result.err
    assert (models[0].parent / f"m0_{EXAMPLE}.bin").exists()


def test_command_line_errors(cli: Cli, models: list[Path]) -> None:
    assert_one_error_line(cli("share", *models), 2, "-p EP or -e EP")
    assert_one_error_line(cli("share", "-e", "example", "-p", EXAMPLE, *models), 2, "-e and -p")
    assert_one_error_line(cli("share", "-e", "example", "-i", "ops=Relu", *models), 2, "'<key>|<value>'")
    assert_one_error_line(cli("share", "-e", "example", "-C", "a|1 a|2", *models), 2, "twice")
    assert_one_error_line(cli("share", "-e", "qnn", *models), 1, "QNNExecutionProvider")
    assert_one_error_line(cli("share", "-e", "nope", *models), 1, "no EP of that name")


def test_plugin_ep_json_config(cli: Cli, models: list[Path], tmp_path: Path) -> None:
    """-p FILE.json as the tool takes it: the library is registered and its EP generates the group."""
    config = tmp_path / "plugin.json"
    config.write_text(json.dumps({
        "ep_library_registration_name": "cli_share_contoso",
        "ep_library_path": str(PLUGIN),
        "selected_ep_name": "ContosoExecutionProvider",
        "default_ep_options": {"ops": "Relu,Add"},
    }))  # fmt: skip
    try:
        result = cli("share", "-p", config, *models, "--json")
        assert result.status == 0, result.err
        assert result.json()["ep"] == "ContosoExecutionProvider"
        assert (tmp_path / "m0_ContosoExecutionProvider.bin").exists()
        _check_runs([tmp_path / "m0_ctx.onnx", tmp_path / "m1_ctx.onnx"], "ContosoExecutionProvider")
    finally:
        epctx.unregister_execution_provider_library("cli_share_contoso")
    config.write_text(json.dumps({"ep_library_registration_name": "x", "ep_library_path": str(PLUGIN)}))
    assert_one_error_line(cli("share", "-p", config, *models), 1, "selected_ep_name")
