"""``epctx check MODEL [-p EP] [--json]``: the verdict per EPContext node and per device, what to do, and exit
status 0 / 1 / 2 as ``inspect --verify``."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from tests.cli.helpers import Cli, assert_one_error_line
from tests.epcontext.models import EXAMPLE


def test_an_example_context_is_optimal(cli: Cli, ctx_model: Path) -> None:
    result = cli("check", ctx_model)
    assert result.status == 0, result
    lines = result.out.splitlines()
    assert lines[0] == f"{ctx_model}: SUPPORTED_OPTIMAL"
    assert sum(line.strip().startswith("node ") for line in lines) == 2  # two EPContext nodes
    assert all("SUPPORTED_OPTIMAL" in line for line in lines if line.startswith("    "))
    data = cli("check", ctx_model, "--json").json()
    assert data["status"] == "EP_SUPPORTED_OPTIMAL" and [n["ep"] for n in data["nodes"]] == [EXAMPLE] * 2
    assert data["nodes"][0]["compatibility_info"].startswith("sdk=example-")


def test_an_unsupported_context_exits_1_saying_what_differs_and_what_to_do(
    cli: Cli, ctx_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import epctx.providers.example.provider as example

    monkeypatch.setattr(example, "PROGRAM_VERSION", 7)
    result = cli("check", ctx_model)
    assert result.status == 1, result
    assert "UNSUPPORTED: program format '1', this ExampleExecutionProvider runs format 7" in result.out
    assert result.out.splitlines()[-1].startswith("what to do: recompile the context")


def test_filter_by_provider_and_models_without_context_nodes(cli: Cli, ctx_model: Path, model: Path) -> None:
    result = cli("check", ctx_model, "-p", "OpenVINOExecutionProvider")
    assert result.status == 0 and "no EPContext node" in result.out
    result = cli("check", model)
    assert result.status == 0 and "NOT_APPLICABLE" in result.out


def test_user_errors(cli: Cli, tmp_path: Path) -> None:
    assert_one_error_line(cli("check", tmp_path / "missing.onnx"), 1, "not found")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\xff\xff\xff\xff not a model")
    assert_one_error_line(cli("check", junk), 1, "junk.onnx")
    assert cli("check").status == 2


def test_a_missing_binary_is_a_finding(cli: Cli, ctx_model: Path) -> None:
    (ctx_model.parent / f"model_{EXAMPLE}.bin").unlink()
    result = cli("check", ctx_model)
    assert result.status == 1 and "its binary cannot be read" in result.out
    assert onnx.load(ctx_model)  # the model itself is untouched


def test_an_embedded_binary_is_judged_on_its_header(cli: Cli, model: Path, tmp_path: Path) -> None:
    assert cli("compile", model, "-p", EXAMPLE, "--embed", "-q").status == 0
    ctx = model.with_name("model_ctx.onnx")
    result = cli("check", ctx)
    assert result.status == 0 and "binary embedded" in result.out, result
    data = cli("check", ctx, "--json").json()
    assert [n["binary"] for n in data["nodes"]] == ["embedded", "embedded"]  # the second: its main context's
    proto = onnx.load(ctx)
    for attr in proto.graph.node[0].attribute:
        if attr.name == "ep_cache_context":
            attr.s = b"EPCTXBIN" + attr.s[8:20] + bytes(12) + attr.s[32:]  # a broken preamble
    onnx.save(proto, tmp_path / "broken_ctx.onnx")
    result = cli("check", tmp_path / "broken_ctx.onnx")
    assert (
        result.status == 1 and "its binary cannot be read" in result.out and "embedded context" in result.out
    )
