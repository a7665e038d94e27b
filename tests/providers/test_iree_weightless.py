"""IREE weightless contexts (ep.enable_weightless_mode 1 / 2): the binary holds code only, IREE's parameters map
the source's files in place, bound by digest: a changed weights file is an error, never a wrong answer."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from benchmarks.models import mlp

import epctx
from epctx.epcontext import ContextBinary
from epctx.errors import InvalidGraph, NoSuchFile
from epctx.testing import no_compile
from tests.oracle import run_ort
from tests.requires import requires

pytestmark = [pytest.mark.slow, requires("iree.runtime", "iree.compiler")]

EP = "IREEExecutionProvider"
BIN = f"m_{EP}.bin"


def _source(folder: Path) -> Path:
    """An MLP whose weight matrices are external data and whose biases lie inside the .onnx."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "m.onnx"
    model = mlp(batch=4, sizes=(64, 128, 128, 10))
    onnx.save(model, path, save_as_external_data=True, location="m.onnx.data", size_threshold=1024)
    return path


def _compile(source: Path, mode: str, *, embed: int = 0) -> Path:
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_embed_mode", str(embed))
    so.add_session_config_entry("ep.enable_weightless_mode", mode)
    epctx.InferenceSession(str(source), so, providers=[EP])
    return source.with_name("m_ctx.onnx")


def _feeds() -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)}


def _run(ctx: Path, **config: str) -> np.ndarray:
    so = epctx.SessionOptions()
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    with no_compile():
        sess = epctx.InferenceSession(str(ctx), so, providers=[EP])
    assert [ep for ep, _ in sess.get_partitions()] == [EP]
    return np.asarray(sess.run(None, _feeds())[0])


def _meta(ctx: Path) -> dict:
    with ContextBinary.open(ctx.with_name(BIN)) as binary:
        [name] = [n for n in binary.names() if n.endswith("/meta")]
        return dict(json.loads(bytes(binary.read(name))))


def _flip(path: Path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x40
    path.write_bytes(raw)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("iree_weightless")
    out = {}
    for mode in ("0", "1", "2"):
        out[mode] = _compile(_source(root / f"mode{mode}"), mode)
    return out


def test_device_metadata_reports_both_modes() -> None:
    [device] = [d for d in epctx.get_ep_devices() if d.ep_name == EP and not d.device.is_virtual]
    assert device.ep_metadata["weightless_supported_modes"] == "all_or_external_only"
    assert device.ep_metadata["weightless_support"] == "all"


@pytest.mark.parametrize("mode", ["1", "2"])
def test_weightless_context_holds_code_only_and_matches_onnxruntime(
    folders: dict[str, Path], mode: str
) -> None:
    ctx = folders[mode]
    meta = onnx.load(ctx, load_external_data=False).metadata_props
    assert {p.key: p.value for p in meta}["weightless_mode"] == mode
    doc = _meta(ctx)
    stored = len(doc["params"])
    mapped = len(doc["external"])
    # mode 1: the three weight matrices (external data) mapped, the two small biases inside the .onnx stored;
    # mode 2: nothing stored.
    assert (stored, mapped) == ((2, 3) if mode == "1" else (0, 5))
    full = ctx.parent.parent / "mode0" / BIN
    assert ctx.with_name(BIN).stat().st_size < full.stat().st_size - 100_000
    expected = run_ort(onnx.load(ctx.parent / "m.onnx"), _feeds())[0]
    np.testing.assert_allclose(_run(ctx), expected, rtol=1e-5, atol=1e-5)


def test_weights_are_mapped_from_the_source_file(folders: dict[str, Path]) -> None:
    ctx = folders["1"]
    with no_compile():
        sess = epctx.InferenceSession(str(ctx), providers=[EP])
    maps = Path("/proc/self/maps").read_text()
    assert str((ctx.parent / "m.onnx.data").resolve()) in maps
    del sess


@pytest.mark.parametrize("mode", ["1", "2"])
def test_changed_weights_file_is_an_error(tmp_path: Path, folders: dict[str, Path], mode: str) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(folders[mode].parent, folder)
    ctx = folder / "m_ctx.onnx"
    good = _run(ctx)
    _flip(folder / "m.onnx.data", 2000)  # same size, one weight changed
    with pytest.raises(InvalidGraph, match=r"m\.onnx\.data' changed since the context was compiled"):
        _run(ctx)
    _flip(folder / "m.onnx.data", 2000)
    np.testing.assert_array_equal(_run(ctx), good)
    if mode == "2":  # ALL maps the .onnx too: an edit of the source model is caught as well
        source = folder / "m.onnx"
        source.write_bytes(source.read_bytes() + b"\0")
        with pytest.raises(InvalidGraph, match=r"m\.onnx' changed since the context was compiled"):
            _run(ctx)


def test_mode_2_finds_the_source_through_context_source_model_path(
    tmp_path: Path, folders: dict[str, Path]
) -> None:
    src = folders["2"].parent
    deploy, models = tmp_path / "deploy", tmp_path / "models"
    deploy.mkdir()
    models.mkdir()
    for name in ("m_ctx.onnx", BIN):
        shutil.copy(src / name, deploy / name)
    for name in ("m.onnx", "m.onnx.data"):
        shutil.copy(src / name, models / name)
    with pytest.raises(NoSuchFile, match="ep.context_source_model_path"):
        _run(deploy / "m_ctx.onnx")
    out = _run(deploy / "m_ctx.onnx", **{"ep.context_source_model_path": str(models / "m.onnx")})
    np.testing.assert_array_equal(out, _run(folders["2"]))


def test_mode_1_weights_in_a_shared_folder(tmp_path: Path, folders: dict[str, Path]) -> None:
    src = folders["1"].parent
    deploy, shared = tmp_path / "variant", tmp_path / "weights"
    deploy.mkdir()
    shared.mkdir()
    for name in ("m_ctx.onnx", BIN):
        shutil.copy(src / name, deploy / name)
    shutil.copy(src / "m.onnx.data", shared / "m.onnx.data")
    folder_key = "session.model_external_initializers_file_folder_path"
    out = _run(deploy / "m_ctx.onnx", **{folder_key: str(shared)})
    np.testing.assert_array_equal(out, _run(folders["1"]))


def test_embedded_weightless_context(tmp_path: Path) -> None:
    ctx = _compile(_source(tmp_path), "1", embed=1)
    assert not (tmp_path / BIN).exists()
    assert os.path.getsize(ctx) < 100_000  # the code and the two biases; the 100 KB of matrices stay outside
    expected = run_ort(onnx.load(tmp_path / "m.onnx"), _feeds())[0]
    np.testing.assert_allclose(_run(ctx), expected, rtol=1e-5, atol=1e-5)
