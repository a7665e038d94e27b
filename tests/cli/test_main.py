"""``epctx --version``, and how every verb fails: one line on stderr naming the problem and the fix, exit status 2
for a wrong command line and 1 for a failed command, JSON with --json, never a traceback for a user error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import epctx
from epctx.cli import main
from tests.cli.helpers import Cli, assert_one_error_line

REPO = Path(__file__).resolve().parents[2]


def test_version(cli: Cli) -> None:
    result = cli("--version")
    assert (result.status, result.out) == (0, f"epctx {epctx.__version__}\n")


@pytest.mark.slow
def test_version_as_a_program() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "epctx.cli", "--version"], capture_output=True, text=True, cwd=REPO
    )
    assert (done.returncode, done.stdout.strip()) == (0, f"epctx {epctx.__version__}")


def test_usage_errors_exit_2_on_one_line(cli: Cli, model: Path) -> None:
    assert_one_error_line(cli("bogus"), 2, "invalid choice", "epctx --help")
    assert_one_error_line(cli("run"), 2, "epctx run:", "model", "epctx run --help")
    assert_one_error_line(cli("run", model, "--no-such-flag"), 2, "--no-such-flag")
    assert_one_error_line(cli("compile", model, "--option", "k=v"), 2, "must follow the -p")


def test_usage_error_with_json_is_json(cli: Cli) -> None:
    result = cli("inspect", "--json")
    assert_one_error_line(result, 2, "model")
    error = result.json()["error"]
    assert error["exit_status"] == 2 and error["type"] == "UsageError" and "model" in error["message"]


def test_bad_files_exit_1_without_traceback(cli: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "notes.onnx"
    bad.write_bytes(b"\xff\xfe this is not a protobuf \x00\x01")
    for args in (
        ("run", bad, "--random"),
        ("compile", bad, "-q"),
        ("inspect", bad),
        ("merge", bad, bad, "-o", tmp_path / "m.onnx"),
    ):
        assert_one_error_line(cli(*args), 1, "notes.onnx")
    assert_one_error_line(cli("run", tmp_path / "nope.onnx", "--random"), 1, "nope.onnx")


def test_a_bug_is_not_hidden(monkeypatch: pytest.MonkeyPatch, model: Path) -> None:
    """Only user errors become one line: an unexpected exception keeps its traceback."""
    import epctx.cli.inspect as verb

    def broken(args: object) -> int:
        raise KeyError("bug")

    monkeypatch.setattr(verb, "inspect", broken)
    with pytest.raises(KeyError):
        main(["inspect", str(model)])
