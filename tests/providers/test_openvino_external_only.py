"""OpenVINO in onnxruntime's weightless mode EXTERNAL_ONLY: the blob references the source's own external data
file at its offsets (the internal initializers stay in the blob), the import maps that file once its digest is
checked; a changed file is an error. ALL is refused before compiling."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from benchmarks.models import mlp

import epctx
from epctx.epcontext import ContextBinary
from epctx.errors import EPFail, InvalidArgument, InvalidGraph
from epctx.testing import no_compile
from tests.oracle import run_ort
from tests.requires import requires

pytestmark = requires("openvino")

EP = "OpenVINOExecutionProvider"
FEEDS = {"input": np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)}


def _compile(folder: Path, mode: str, **options: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "m.onnx"
    onnx.save(
        mlp(batch=4, sizes=(64, 128, 128, 10)), source, save_as_external_data=True, location="m.onnx.data"
    )
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.enable_weightless_mode", mode)
    epctx.InferenceSession(str(source), so, providers=[(EP, options)])
    return folder / "m_ctx.onnx"


def _run(ctx: Path) -> np.ndarray:
    with no_compile():
        sess = epctx.InferenceSession(str(ctx), providers=[EP])
    assert [ep for ep, _ in sess.get_partitions()] == [EP]
    return np.asarray(sess.run(None, FEEDS)[0])


def test_external_only_maps_the_source_data_file(tmp_path: Path) -> None:
    ctx = _compile(tmp_path / "a", "1")
    binary = ctx.with_name(f"m_{EP}.bin")
    weights = (ctx.parent / "m.onnx.data").stat().st_size
    assert binary.stat().st_size < weights / 4  # the code and the biases; not the matrices
    with ContextBinary.open(binary) as opened:
        [name] = [n for n in opened.names() if n.endswith("/meta")]
        meta = json.loads(bytes(opened.read(name)))
    assert meta["source"]["location"] == "m.onnx.data" and meta["weights"] == []
    assert not [
        p for p in ctx.parent.iterdir() if p.name.startswith(".epctx-ov-")
    ]  # the compile's temporary file
    expected = run_ort(onnx.load(ctx.parent / "m.onnx"), FEEDS)[0]
    np.testing.assert_allclose(_run(ctx), expected, rtol=1e-5, atol=1e-5)
    # a copy elsewhere finds its weights through the folder option, as onnxruntime's
    deploy, shared = tmp_path / "deploy", tmp_path / "shared"
    deploy.mkdir()
    shared.mkdir()
    shutil.copy(ctx, deploy / ctx.name)
    shutil.copy(binary, deploy / binary.name)
    shutil.copy(ctx.parent / "m.onnx.data", shared / "m.onnx.data")
    so = epctx.SessionOptions()
    so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(shared))
    sess = epctx.InferenceSession(str(deploy / ctx.name), so, providers=[EP])
    np.testing.assert_allclose(sess.run(None, FEEDS)[0], expected, rtol=1e-5, atol=1e-5)


def test_a_changed_weights_file_is_an_error(tmp_path: Path) -> None:
    ctx = _compile(tmp_path, "1")
    data = ctx.parent / "m.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0x40
    data.write_bytes(raw)
    with pytest.raises(InvalidGraph, match=r"m\.onnx\.data' changed since the context was compiled"):
        _run(ctx)


def test_all_is_refused_and_the_two_weightless_options_exclude_each_other(tmp_path: Path) -> None:
    with pytest.raises(EPFail, match="does not support weightless mode 2"):
        _compile(tmp_path / "all", "2")
    with pytest.raises(InvalidArgument, match="exclude each other"):
        _compile(tmp_path / "both", "1", weightless="1")


def test_device_metadata() -> None:
    [device] = [d for d in epctx.get_ep_devices() if d.ep_name == EP and d.device.type.name == "CPU"]
    assert device.ep_metadata["weightless_supported_modes"] == "external_only"
