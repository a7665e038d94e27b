"""``epctx inspect --verify`` exits 1 when it reports a finding; with --json every error is JSON too."""

from __future__ import annotations

from pathlib import Path

from tests.cli.helpers import Cli, assert_one_error_line
from tests.epcontext.models import EXAMPLE


def test_verify_exit_status_follows_the_findings(cli: Cli, ctx_model: Path) -> None:
    assert cli("inspect", ctx_model, "--verify").status == 0
    binary = ctx_model.with_name(f"model_{EXAMPLE}.bin")
    data = bytearray(binary.read_bytes())
    data[-1] ^= 0xFF  # one flipped byte: a checksum mismatch
    binary.write_bytes(bytes(data))
    assert cli("inspect", ctx_model).status == 0  # without --verify, findings are reported, not failed on
    result = cli("inspect", ctx_model, "--verify", "--json")
    assert result.status == 1 and result.json()["findings"]


def test_missing_binary_is_a_finding(cli: Cli, ctx_model: Path) -> None:
    ctx_model.with_name(f"model_{EXAMPLE}.bin").unlink()
    result = cli("inspect", ctx_model, "--verify")
    assert result.status == 1 and "findings: " in result.out


def test_errors_are_json_with_json(cli: Cli, tmp_path: Path) -> None:
    result = cli("inspect", tmp_path / "nope.onnx", "--json")
    assert_one_error_line(result, 1, "nope.onnx")
    error = result.json()["error"]
    assert error["exit_status"] == 1 and "nope.onnx" in error["message"] and error["type"] == "NoSuchFile"
