"""``epctx compile``: outputs checked before compiling (--force to overwrite, no silent mkdir); without -p the
selection policy picks the compiling EP and the command says which; -p values with commas."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest

import epctx
from epctx.testing import no_compile
from tests.cli.helpers import Cli, assert_one_error_line
from tests.epcontext.models import EXAMPLE, feed, two_partition_model
from tests.oracle import run_ort


def test_existing_output_is_refused_before_compiling(cli: Cli, ctx_model: Path) -> None:
    before = ctx_model.read_bytes()
    with no_compile():  # a compile would raise ModelRequiresCompilation instead of the --force message
        result = cli("compile", ctx_model.with_name("model.onnx"), "-p", EXAMPLE)
    assert_one_error_line(result, 1, "model_ctx.onnx", "exists", "--force")
    assert ctx_model.read_bytes() == before
    assert cli("compile", ctx_model.with_name("model.onnx"), "-p", EXAMPLE, "--force", "-q").status == 0


def test_output_into_a_missing_folder_is_an_error(cli: Cli, model: Path, tmp_path: Path) -> None:
    with no_compile():
        result = cli("compile", model, "-p", EXAMPLE, "-o", tmp_path / "new" / "out.onnx")
    assert_one_error_line(result, 1, "does not exist", "mkdir -p")
    assert not (tmp_path / "new").exists()
    assert_one_error_line(cli("compile", model, "-p", EXAMPLE, "-o", tmp_path), 1, "is a folder")


def test_output_path_and_json_report(cli: Cli, model: Path, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    result = cli("compile", model, "-p", EXAMPLE, "-o", tmp_path / "out" / "f32.onnx", "--json")
    assert result.status == 0, result.err
    report = result.json()
    assert report["providers"] == [EXAMPLE]
    assert {Path(p).name for p in report["files"]} == {"f32.onnx", f"f32_{EXAMPLE}.bin"}
    with no_compile():
        sess = epctx.InferenceSession(str(tmp_path / "out" / "f32.onnx"), providers=[EXAMPLE])
    np.testing.assert_allclose(
        sess.run(None, feed())[0], run_ort(two_partition_model(), feed())[0], atol=1e-5
    )


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="OpenVINO is not installed")
def test_without_p_the_policy_picks_the_compiling_ep_and_says_so(cli: Cli, model: Path) -> None:
    result = cli("compile", model)
    assert result.status == 0, result.err
    assert "compiling EP OpenVINOExecutionProvider" in result.err and "MAX_PERFORMANCE" in result.err
    ctx = model.with_name("model_ctx.onnx")
    sources = {
        a.s.decode() for n in onnx.load(ctx).graph.node if n.op_type == "EPContext" for a in n.attribute
        if a.name == "source"
    }  # fmt: skip
    assert sources == {"OpenVINOExecutionProvider"}
    assert cli("compile", model, "--json", "--force").json()["providers"] == ["OpenVINOExecutionProvider"]


def test_without_p_and_no_compiling_ep_it_fails(
    cli: Cli, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine where the policy finds only the CPU EP: an error naming the fix, not a silent CPU-only model."""
    from epctx.providers import registry, selection

    monkeypatch.setattr(
        selection, "resolve_providers", lambda *a, **k: [registry.create_provider("CPUExecutionProvider")]
    )
    assert_one_error_line(cli("compile", model), 1, "no compiling EP", "-p")
    assert not model.with_name("model_ctx.onnx").exists()


def _other_nodes(path: Path) -> list[str]:
    return sorted(
        n.op_type for n in onnx.load(path, load_external_data=False).graph.node if n.op_type != "EPContext"
    )


def test_option_values_with_commas(cli: Cli, model: Path) -> None:
    """ops=MatMul,Relu taken whole: Relu joins the EP's partitions (split, it would be an error)."""
    ctx = model.with_name("model_ctx.onnx")
    for args in (["-p", f'{EXAMPLE}:ops="MatMul,Relu"'], ["-p", EXAMPLE, "--option", "ops=MatMul,Relu"]):
        assert cli("compile", model, *args, "--force", "-q").status == 0
        assert _other_nodes(ctx) == ["Add", "LayerNormalization", "Sigmoid"]
    assert cli("compile", model, "-p", f"{EXAMPLE}:ops=MatMul", "--force", "-q").status == 0
    assert _other_nodes(ctx) == ["Add", "LayerNormalization", "Relu", "Sigmoid"]
