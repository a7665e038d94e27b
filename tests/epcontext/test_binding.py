"""A context model runs only the payload it was made with: names that cannot collide, identity recorded in every
EPContext node and checked at load (and by ``inspect``), shared binaries never served stale."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

import epctx
from epctx.cli import main as cli_main
from epctx.epcontext.identity import IDENTITY_ATTRIBUTE
from epctx.errors import EPCtxError
from epctx.session.compile_guard import no_compile
from epctx.tools.inspect import inspect_model
from tests.epcontext.models import EXAMPLE, feed, two_partition_model
from tests.oracle import run_ort


def _compile(source: Path, out: Path, **config: str) -> None:
    so = epctx.SessionOptions()
    so.add_provider(EXAMPLE, {})
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    epctx.ModelCompiler(so, str(source)).compile_to_file(str(out))


def _save(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path


def _run(ctx: Path, **config: str) -> np.ndarray:
    so = epctx.SessionOptions()
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    with no_compile():
        return epctx.InferenceSession(str(ctx), so, providers=[EXAMPLE]).run(None, feed())[0]


def _expected(seed: int) -> np.ndarray:
    return run_ort(two_partition_model(seed), feed())[0]


def test_two_outputs_of_one_stem_in_one_folder_keep_their_own_binaries(tmp_path):
    # Same input stem, two compiles into one folder (the f32 / f16 situation): each output gets its own binary.
    a = _save(two_partition_model(0), tmp_path / "a" / "model.onnx")
    b = _save(two_partition_model(1), tmp_path / "b" / "model.onnx")
    _compile(a, tmp_path / "out" / "first.onnx")
    _compile(b, tmp_path / "out" / "second.onnx")
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert names == {"first.onnx", "second.onnx", f"first_{EXAMPLE}.bin", f"second_{EXAMPLE}.bin"}
    np.testing.assert_allclose(_run(tmp_path / "out" / "first.onnx"), _expected(0), atol=1e-5)
    np.testing.assert_allclose(_run(tmp_path / "out" / "second.onnx"), _expected(1), atol=1e-5)


def test_every_epcontext_node_records_its_payload_identity(tmp_path):
    src = _save(two_partition_model(), tmp_path / "model.onnx")
    _compile(src, tmp_path / "model_ctx.onnx")
    nodes = [n for n in onnx.load(tmp_path / "model_ctx.onnx").graph.node if n.op_type == "EPContext"]
    assert len(nodes) == 2
    identities = {
        onnx.helper.get_attribute_value(a) for n in nodes for a in n.attribute if a.name == IDENTITY_ATTRIBUTE
    }
    assert len(identities) == 2 and all(i.startswith(b"xxh3_128:") for i in identities)
    # Byte-identical regeneration: same identities, same files.
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    _compile(src, tmp_path / "model_ctx.onnx")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_binary_from_another_generation_is_invalid_graph(tmp_path):
    # Two models compiled separately; then one's binary is copied over the other's: both have the same graph
    # names, so only the identity tells them apart.
    a = _save(two_partition_model(0), tmp_path / "a" / "model.onnx")
    b = _save(two_partition_model(1), tmp_path / "b" / "model.onnx")
    _compile(a, tmp_path / "a" / "model_ctx.onnx")
    _compile(b, tmp_path / "b" / "model_ctx.onnx")
    shutil.copyfile(tmp_path / "b" / f"model_{EXAMPLE}.bin", tmp_path / "a" / f"model_{EXAMPLE}.bin")
    with pytest.raises(epctx.InvalidGraph, match=r"not the binary this model was made with.*identity"):
        _run(tmp_path / "a" / "model_ctx.onnx")
    report = inspect_model(tmp_path / "a" / "model_ctx.onnx")
    assert any("identity" in f.message for f in report.errors), report.findings
    assert cli_main(["inspect", str(tmp_path / "a" / "model_ctx.onnx"), "--verify"]) != 0
    assert cli_main(["inspect", str(tmp_path / "b" / "model_ctx.onnx"), "--verify"]) == 0


def test_an_edited_identity_attribute_is_refused(tmp_path):
    src = _save(two_partition_model(), tmp_path / "model.onnx")
    _compile(src, tmp_path / "model_ctx.onnx", **{"ep.context_embed_mode": "1"})
    model = onnx.load(tmp_path / "model_ctx.onnx")
    for attr in model.graph.node[0].attribute:
        if attr.name == IDENTITY_ATTRIBUTE:
            attr.s = b"xxh3_128:" + b"0" * 32
    onnx.save(model, tmp_path / "model_ctx.onnx")
    with pytest.raises(epctx.InvalidGraph, match="identity"):
        _run(tmp_path / "model_ctx.onnx")


def test_hardware_architecture_is_checked_against_the_binary(tmp_path):
    src = _save(two_partition_model(), tmp_path / "model.onnx")
    _compile(src, tmp_path / "model_ctx.onnx")
    model = onnx.load(tmp_path / "model_ctx.onnx")
    model.graph.node[0].attribute.append(onnx.helper.make_attribute("hardware_architecture", "riscv64"))
    onnx.save(model, tmp_path / "model_ctx.onnx")
    with pytest.raises(epctx.InvalidGraph, match="hardware_architecture 'riscv64'"):
        _run(tmp_path / "model_ctx.onnx")
    assert any(
        "hardware_architecture" in f.message for f in inspect_model(tmp_path / "model_ctx.onnx").errors
    )


def _share(sources: list[Path], **config: str) -> None:
    for k, source in enumerate(sources):
        extra = {"ep.share_ep_contexts": "1", **config}
        if k == len(sources) - 1:
            extra["ep.stop_share_ep_contexts"] = "1"
        _compile(source, source.with_name(f"{source.stem}_ctx.onnx"), **extra)


def test_a_regenerated_shared_binary_is_never_served_from_the_workspace(tmp_path):
    sources = [_save(two_partition_model(k), tmp_path / f"m{k}.onnx") for k in range(2)]
    _share(sources)
    shared = {"ep.share_ep_contexts": "1"}
    np.testing.assert_allclose(_run(tmp_path / "m0_ctx.onnx", **shared), _expected(0), atol=1e-5)
    # Regenerate the group with other weights: once over the old files (new names), once after deleting them
    # (the same names, new files), while the process still holds the first binary open.
    for round_, clean in enumerate((False, True)):
        seed = 10 + round_
        if clean:
            for p in tmp_path.glob("*_ctx.onnx"):
                p.unlink()
            for p in tmp_path.glob("*.bin"):
                p.unlink()
        for k, source in enumerate(sources):
            _save(two_partition_model(seed + k), source)
        _share(sources)
        np.testing.assert_allclose(_run(tmp_path / "m0_ctx.onnx", **shared), _expected(seed), atol=1e-5)
        np.testing.assert_allclose(_run(tmp_path / "m1_ctx.onnx", **shared), _expected(seed + 1), atol=1e-5)
        assert len(list(tmp_path.glob("*.bin"))) == 1  # the previous generation's binary is gone


def test_one_external_initializer_file_per_group_deduplicated(tmp_path):
    sources = [_save(two_partition_model(k), tmp_path / f"m{k}.onnx") for k in range(3)]
    # m2 repeats m0's weights: its CPU-fallback initializers are stored once in the group's file.
    _save(two_partition_model(0), sources[2])
    _share(sources, **{"ep.context_model_external_initializers_file_name": "cpu_weights.bin"})
    assert (tmp_path / "cpu_weights.bin").is_file()
    for k, seed in enumerate((0, 1, 0)):
        np.testing.assert_allclose(_run(tmp_path / f"m{k}_ctx.onnx"), _expected(seed), atol=1e-5)
    # ln_scale and ln_bias (16 float32 each) of two distinct models, 64-byte aligned: 4 tensors, not 6.
    assert (tmp_path / "cpu_weights.bin").stat().st_size <= 4 * 64


def test_a_failed_session_rolls_its_sharing_group_back(tmp_path, caplog):
    sources = [_save(two_partition_model(k), tmp_path / "g" / f"m{k}.onnx") for k in range(2)]
    _compile(sources[0], tmp_path / "g" / "m0_ctx.onnx", **{"ep.share_ep_contexts": "1"})
    with pytest.raises(EPCtxError):  # the last session fails: its model does not exist
        _compile(
            tmp_path / "g" / "missing.onnx",
            tmp_path / "g" / "missing_ctx.onnx",
            **{"ep.share_ep_contexts": "1", "ep.stop_share_ep_contexts": "1"},
        )
    assert "rolled back" in caplog.text
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == [
        "m0.onnx",
        "m1.onnx",
    ]  # nothing half-written
    # The next group, in another folder, starts fresh.
    other = [_save(two_partition_model(k), tmp_path / "h" / f"n{k}.onnx") for k in range(2)]
    _share(other)
    np.testing.assert_allclose(_run(tmp_path / "h" / "n1_ctx.onnx"), _expected(1), atol=1e-5)


def test_the_framework_checks_input_and_output_names_against_the_graph(tmp_path):
    # The binary records each graph's input and output names (epctx.io); a node rewired to other values is
    # refused before the EP sees it.
    src = _save(two_partition_model(), tmp_path / "model.onnx")
    _compile(src, tmp_path / "model_ctx.onnx")
    model = onnx.load(tmp_path / "model_ctx.onnx")
    node = model.graph.node[0]
    node.input[0] = "renamed"
    model.graph.input[0].name = "renamed"
    onnx.save(model, tmp_path / "model_ctx.onnx")
    with pytest.raises(epctx.InvalidGraph, match=r"its graph reads \['x'\].*node has inputs \['renamed'\]"):
        _run(tmp_path / "model_ctx.onnx")


def test_an_ep_saves_only_what_it_compiled(tmp_path):
    from epctx.epcontext import generate
    from epctx.providers.example import ExampleExecutionProvider

    with pytest.raises(epctx.InvalidArgument, match="was not compiled by this EP"):
        generate._check_compiled_type(ExampleExecutionProvider(), "p", object())
