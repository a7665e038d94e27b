"""``epctx package build|select|inspect|validate`` through the command line, on the Example EP (a real compiling
EP without a backend) and the plain model: progress per job, the summary table, incremental rebuilds, SPEC
mistakes as usage errors naming the SPEC."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import epctx
from epctx.cli import main
from epctx.testing.conformance import models


def _spec(folder: Path, extra: str = "") -> Path:
    onnx.save(models.chain(), folder / "chain.onnx")
    onnx.save(models.partial(), folder / "partial.onnx")
    spec = folder / "spec.toml"
    spec.write_text(
        '[package]\nname = "demo"\n\n[components.chain]\nmodel = "chain.onnx"\n\n'
        '[components.partial]\nmodel = "partial.onnx"\n\n'
        '[[targets]]\nname = "example"\nep = "ExampleExecutionProvider"\n\n'
        '[[targets]]\nname = "cpu"\nep = "CPUExecutionProvider"\n' + extra
    )
    return spec


@pytest.mark.slow  # a process pool and four compiles: seconds
def test_build_select_inspect_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(tmp_path)
    pkg = tmp_path / "pkg"
    assert main(["package", "build", str(spec), "-o", str(pkg), "--workers", "1"]) == 0
    captured = capsys.readouterr()
    assert "4 jobs: 0 cached, 4 to run on local" in captured.err and "[4/4]" in captured.err
    assert "chain/example" in captured.out and "4 jobs: 4 run on local, 0 from the cache" in captured.out
    assert main(["package", "build", str(spec), "-o", str(pkg), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {job["where"] for job in report["jobs"]} == {"cache"}
    assert main(["package", "select", str(pkg), "--json"]) == 0
    ranked = json.loads(capsys.readouterr().out)
    assert [(r["variant"], r["status"]) for r in ranked["chain"]] == [
        ("example", "EP_SUPPORTED_OPTIMAL"),
        ("cpu", "EP_NOT_APPLICABLE"),
    ]
    assert main(["package", "inspect", str(pkg), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in info["components"]] == ["chain", "partial"] and len(info["assets"]) == 1
    assert main(["package", "validate", str(pkg)]) == 0
    ctx = epctx.ModelPackageContext(pkg)
    feeds = models.feeds()
    for name, model in (("chain", models.chain()), ("partial", models.partial())):
        chosen = ctx.select_component(name)
        assert chosen.get_selected_variant_name() == "example"
        got = chosen.create_session().run(None, feeds)
        expected = epctx.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(got[0], expected.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('\n[[targets]]\nname = "cpu"\nep = "CPUExecutionProvider"\n', "target names repeat"),
        (
            '\n[[targets]]\nname = "x"\nep = "ExampleExecutionProvider"\ndevice = "tpu"\n',
            "not cpu, gpu or npu",
        ),
        ('\n[[targets]]\nname = "../x"\nep = "ExampleExecutionProvider"\n', "target name"),
        ("\n[surprise]\n", "unknown table"),
    ],
)
def test_spec_mistakes_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, message: str
) -> None:
    spec = _spec(tmp_path, extra)
    assert main(["package", "build", str(spec), "-o", str(tmp_path / "pkg")]) != 0
    err = capsys.readouterr().err
    assert message in err and "spec.toml" in err
    assert not (tmp_path / "pkg").exists()


def test_an_output_that_is_not_a_package_is_never_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _spec(tmp_path)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.txt").write_text("years of work")
    assert main(["package", "build", str(spec), "-o", str(precious)]) != 0
    assert "is not a model package" in capsys.readouterr().err
    assert (precious / "thesis.txt").read_text() == "years of work"
