"""onnxruntime-style user scripts run twice in fresh processes, with onnxruntime and with epctx as
``onnxruntime`` (the shim folder first on PYTHONPATH): same exit status, same printed values (floats compared
to 5 significant digits), differences only where ``differences.py`` documents them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.parity.differences import DIFFERENCES

pytest.importorskip("onnxruntime")

HERE = Path(__file__).resolve().parent
SCRIPTS = sorted((HERE / "scripts").glob("*.py"))
SRC = HERE.parents[1] / "src"
_FLOAT = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?|-?\d+[eE][-+]?\d+")


def _normalise(line: str) -> str:
    def fmt(match: re.Match[str]) -> str:
        value = float(f"{float(match.group()):.5g}")
        return repr(0.0 if value == 0 else value)

    return _FLOAT.sub(fmt, line)


def _run(script: Path, folder: Path, *, epctx: bool) -> tuple[int, dict[str, str], str]:
    folder.mkdir()
    shutil.copy(script, folder / script.name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE / "shim"), str(SRC)]) if epctx else ""
    proc = subprocess.run(
        [sys.executable, script.name], cwd=folder, env=env, capture_output=True, text=True, timeout=120
    )
    values: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        key, sep, value = line.partition(": ")
        assert sep, f"{script.name}: printed line without 'key: value': {line!r}"
        assert key not in values, f"{script.name}: key {key!r} printed twice"
        values[key] = _normalise(value)
    return proc.returncode, values, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_script_prints_the_same_under_onnxruntime_and_epctx(script: Path, tmp_path: Path) -> None:
    ort_rc, ort_out, ort_err = _run(script, tmp_path / "onnxruntime", epctx=False)
    ep_rc, ep_out, ep_err = _run(script, tmp_path / "epctx", epctx=True)
    assert ort_rc == 0, f"{script.name} fails under onnxruntime itself:\n{ort_err[-3000:]}"
    assert ep_rc == ort_rc, (
        f"{script.name}: exit status {ep_rc} under epctx, {ort_rc} under onnxruntime:\n{ep_err[-3000:]}"
    )
    assert list(ep_out) == list(ort_out), f"{script.name}: printed keys differ"
    for key, ort_value in ort_out.items():
        documented = DIFFERENCES.get((script.name, key))
        if documented is None:
            assert ep_out[key] == ort_value, (
                f"{script.name} {key!r}: epctx {ep_out[key]!r}, onnxruntime {ort_value!r}"
            )
        else:
            expected_ort, expected_epctx, _why = documented
            assert (ort_value, ep_out[key]) == (expected_ort, expected_epctx), (
                f"{script.name} {key!r}: documented difference is onnxruntime {expected_ort!r} / epctx "
                f"{expected_epctx!r}, got {ort_value!r} / {ep_out[key]!r}: update tests/parity/differences.py"
            )


def test_documented_differences_name_printed_keys() -> None:
    names = {s.name for s in SCRIPTS}
    for script, key in DIFFERENCES:
        assert script in names, f"differences.py names a script that does not exist: {script}"
        assert f'"{key}:' in (HERE / "scripts" / script).read_text(), f"{script} prints no {key!r}"
