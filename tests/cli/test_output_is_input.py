"""An output that is an input is refused, ``--force`` or not, before anything is compiled: the model itself (by
path, another spelling of it, a link to it), a file it reads (external data) under a binary name, and, for
``share``, one model's output that is another's input. The Python API (``ModelCompiler``) refuses it too."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest

import epctx
from epctx.testing import no_compile
from tests.cli.helpers import Cli, assert_one_error_line
from tests.epcontext.models import EXAMPLE, two_partition_model


def _unchanged(path: Path, before: bytes) -> None:
    assert path.read_bytes() == before
    onnx.checker.check_model(onnx.load(path))


@pytest.mark.parametrize("force", [(), ("--force",)])
def test_compile_onto_the_source_model_is_refused(cli: Cli, model: Path, force: tuple[str, ...]) -> None:
    before = model.read_bytes()
    os.symlink(model.name, model.with_name("link.onnx"))
    (model.parent / "sub").mkdir()
    for output in (model, model.parent / "sub" / ".." / model.name, model.with_name("link.onnx")):
        with no_compile():
            result = cli("compile", model, "-p", EXAMPLE, "-o", output, *force)
        assert_one_error_line(result, 1, repr(str(output)), "is the input model", "another path")
        _unchanged(model, before)
    assert sorted(p.name for p in model.parent.iterdir()) == ["link.onnx", "model.onnx", "sub"]


def test_a_binary_named_like_the_sources_external_data_is_refused(cli: Cli, tmp_path: Path) -> None:
    """``-o model_ctx.onnx`` writes ``model_<EP>.bin``: here that name is the source's external-data file."""
    source = tmp_path / "model.onnx"
    data = f"model_{EXAMPLE}.bin"
    onnx.save(two_partition_model(), source, save_as_external_data=True, location=data, size_threshold=0)
    before = (tmp_path / data).read_bytes()
    with no_compile():
        result = cli("compile", source, "-p", EXAMPLE, "--force")
    assert_one_error_line(result, 1, f"'{tmp_path / data}'", f"'{data}', which the input model", "reads")
    assert (tmp_path / data).read_bytes() == before
    assert not (tmp_path / "model_ctx.onnx").exists()


def test_model_compiler_refuses_it_too(model: Path) -> None:
    so = epctx.SessionOptions()
    so.add_provider(EXAMPLE, {})
    before = model.read_bytes()
    with no_compile(), pytest.raises(epctx.InvalidArgument, match="is the input model"):
        epctx.ModelCompiler(so, str(model)).compile_to_file(str(model))
    _unchanged(model, before)


def test_share_refuses_an_output_that_is_another_models_input(cli: Cli, model: Path) -> None:
    """``share a.onnx a_ctx.onnx``: the first model's context model would replace the second model."""
    second = model.with_name("model_ctx.onnx")
    onnx.save(two_partition_model(seed=1), second)
    before = second.read_bytes()
    with no_compile():
        result = cli("share", "-p", EXAMPLE, model, second, "--force")
    assert_one_error_line(result, 1, repr(str(second)), "is the input model")
    _unchanged(second, before)


def test_model_compiler_refuses_an_external_initializers_file_the_source_reads(tmp_path: Path) -> None:
    source = tmp_path / "model.onnx"
    onnx.save(
        two_partition_model(), source, save_as_external_data=True, location="weights.data", size_threshold=0
    )
    before = (tmp_path / "weights.data").read_bytes()
    so = epctx.SessionOptions()
    so.add_provider(EXAMPLE, {})
    compiler = epctx.ModelCompiler(so, str(source), external_initializers_file_path="weights.data")
    with no_compile(), pytest.raises(epctx.InvalidArgument, match="'weights.data', which the input model"):
        compiler.compile_to_file(str(tmp_path / "out_ctx.onnx"))
    assert (tmp_path / "weights.data").read_bytes() == before
    assert not (tmp_path / "out_ctx.onnx").exists()
