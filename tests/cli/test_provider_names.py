"""Provider names: a misspelt one gets a "did you mean" (from the library's one resolution, so a script gets it
too), and the short names ``share -e`` takes (``openvino``, ``example``, ``cpu``...) are taken by ``-p`` on every
verb. A full name in another case is a typo, not a short name: onnxruntime wants the exact string."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

import epctx
from epctx.testing import no_compile
from tests.cli.helpers import Cli, assert_one_error_line
from tests.epcontext.models import EXAMPLE
from tests.epcontext.test_weight_sharing import _variant

TYPOS = [
    ("OpenVinoExecutionProvider", "OpenVINOExecutionProvider"),
    ("ExampleExecutionProvidr", EXAMPLE),
    ("CudaExecutionProvider", "CUDAExecutionProvider"),
    ("iree", "IREEExecutionProvider"),  # a short name the Python API does not take
]


@pytest.mark.parametrize(("typo", "meant"), TYPOS)
def test_a_typo_gets_did_you_mean_in_the_python_api(model: Path, typo: str, meant: str) -> None:
    hint = f"unknown execution provider '{typo}' (did you mean '{meant}'?)"
    with pytest.raises(epctx.InvalidArgument) as info:
        epctx.InferenceSession(str(model), providers=[typo])
    assert hint in str(info.value)
    so = epctx.SessionOptions()
    so.add_provider(typo, {})
    with no_compile(), pytest.raises(epctx.InvalidArgument) as info:
        epctx.ModelCompiler(so, str(model)).compile_to_bytes()
    assert hint in str(info.value)


def test_no_suggestion_for_a_name_like_none(model: Path) -> None:
    with pytest.raises(epctx.InvalidArgument, match="unknown execution provider 'NoSuchEP'; available: "):
        epctx.InferenceSession(str(model), providers=["NoSuchEP"])


def test_a_typo_gets_did_you_mean_on_every_verb(cli: Cli, model: Path, ctx_model: Path) -> None:
    typo = "OpenVinoExecutionProvider"
    hint = "did you mean 'OpenVINOExecutionProvider'?"
    with no_compile():
        for args in (
            ("compile", model, "-p", typo, "--force"),
            ("run", ctx_model, "-p", typo, "--random", "--dim", "N=2"),
            ("share", "-p", typo, model),
            ("demo", "-p", typo),
            ("conformance", "-p", typo),
        ):
            assert_one_error_line(cli(*args), 1, f"'{typo}'", hint)


def test_short_names_on_every_verb(cli: Cli, model: Path, tmp_path: Path) -> None:
    """``-p example`` (and ``Example``) is the Example EP, ``-p cpu`` the CPU EP, as ``share -e`` takes them."""
    result = cli("compile", model, "-p", "example:ops=MatMul", "--json")
    assert result.status == 0, result.err
    assert result.json()["providers"] == [EXAMPLE]
    ctx = model.with_name("model_ctx.onnx")
    with no_compile():
        result = cli("run", ctx, "-p", "Example", "-p", "cpu", "--random", "--dim", "N=2", "--json")
    assert result.status == 0, result.err
    assert result.json()["providers"] == [EXAMPLE, "CPUExecutionProvider"]
    models = [tmp_path / f"v{k}.onnx" for k in range(2)]
    for k, path in enumerate(models):
        onnx.save(_variant(k), path)
    result = cli("share", "-p", "example", *models, "--json")
    assert result.status == 0, result.err
    assert result.json()["ep"] == EXAMPLE
    assert (tmp_path / f"v0_{EXAMPLE}.bin").is_file()
    result = cli("demo", "-p", "cpu")
    assert result.status == 0 and "EP: CPUExecutionProvider" in result.out
    twice = cli("compile", model, "-p", "example", "-p", EXAMPLE, "--force")
    assert_one_error_line(twice, 1, "listed twice")
