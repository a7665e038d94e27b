"""Self-healing contexts (``epctx.self_heal``): a stale IREE context (x86-64-v2 code on this CPU:
PREFER_RECOMPILATION; aarch64 code: UNSUPPORTED) is compiled again from its source, in the foreground or in the
background while the current binary or the CPU EP serves; never from a source changed since; always logged,
and ``epctx check`` says whether and from where it can heal."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from benchmarks.models import mlp

import epctx
from epctx.cache import heal
from epctx.cache.verdicts import check_model
from epctx.cli import main
from epctx.ep._compatibility import OrtCompiledModelCompatibility as Compat
from epctx.errors import InvalidArgument
from tests.oracle import run_ort
from tests.requires import requires

EP = "IREEExecutionProvider"
FEEDS = {"input": np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)}


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="epctx.self_heal"):
        epctx.SessionOptions().add_session_config_entry("epctx.self_heal", "sometimes")


@pytest.fixture(scope="module")
def stale(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stale")
    found = {}
    for target in ("x86-64-v2", "aarch64"):
        folder = root / target
        folder.mkdir()
        source = folder / "m.onnx"
        onnx.save(
            mlp(batch=4, sizes=(64, 128, 128, 10)), source, save_as_external_data=True, location="m.onnx.data"
        )
        so = epctx.SessionOptions()
        so.add_session_config_entry("ep.context_enable", "1")
        epctx.InferenceSession(str(source), so, providers=[(EP, {"target": target})])
        found[target] = folder
    return found


def _copy(stale: dict[str, Path], target: str, tmp_path: Path) -> Path:
    folder = tmp_path / target
    shutil.copytree(stale[target], folder)
    return folder / "m_ctx.onnx"


def _session(ctx: Path, policy: str | None, **config: str) -> epctx.InferenceSession:
    so = epctx.SessionOptions()
    if policy is not None:
        so.add_session_config_entry("epctx.self_heal", policy)
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    return epctx.InferenceSession(str(ctx), so, providers=[EP])


def _expected(ctx: Path) -> np.ndarray:
    return run_ort(onnx.load(ctx.parent / "m.onnx"), FEEDS)[0]


@pytest.mark.slow
@requires("iree.runtime", "iree.compiler")
def test_foreground_heals_a_context_that_prefers_recompilation(
    stale: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ctx = _copy(stale, "x86-64-v2", tmp_path)
    assert check_model(ctx).status == Compat.EP_SUPPORTED_PREFER_RECOMPILATION
    with caplog.at_level(logging.WARNING, "epctx"):
        sess = _session(ctx, "foreground")
    assert "is EP_SUPPORTED_PREFER_RECOMPILATION here" in caplog.text and "compiled again" in caplog.text
    assert [ep for ep, _ in sess.get_partitions()] == [EP]
    np.testing.assert_allclose(sess.run(None, FEEDS)[0], _expected(ctx), rtol=1e-5, atol=1e-5)
    assert check_model(ctx).status == Compat.EP_SUPPORTED_OPTIMAL
    caplog.clear()
    with caplog.at_level(logging.WARNING, "epctx"):
        _session(ctx, "foreground")  # healed: the next session just loads it
    assert "self_heal" not in caplog.text


@pytest.mark.slow
@requires("iree.runtime", "iree.compiler")
def test_background_serves_on_cpu_while_an_unsupported_context_heals(
    stale: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ctx = _copy(stale, "aarch64", tmp_path)
    assert check_model(ctx).status == Compat.EP_UNSUPPORTED
    with caplog.at_level(logging.WARNING, "epctx"):
        sess = _session(ctx, "background")
        assert {ep for ep, _ in sess.get_partitions()} == {"CPUExecutionProvider"}
        np.testing.assert_allclose(sess.run(None, FEEDS)[0], _expected(ctx), rtol=1e-5, atol=1e-5)
        assert heal.wait_background(300)
    assert "served from" in caplog.text and "recompiled in the background" in caplog.text
    assert check_model(ctx).status == Compat.EP_SUPPORTED_OPTIMAL
    nxt = _session(ctx, None)
    assert [ep for ep, _ in nxt.get_partitions()] == [EP]
    np.testing.assert_allclose(nxt.run(None, FEEDS)[0], _expected(ctx), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@requires("iree.runtime", "iree.compiler")
def test_a_changed_source_is_never_used(
    stale: dict[str, Path],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ctx = _copy(stale, "x86-64-v2", tmp_path)
    data = ctx.parent / "m.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[64] ^= 1
    data.write_bytes(raw)
    before = ctx.read_bytes()
    with caplog.at_level(logging.WARNING, "epctx"):
        sess = _session(ctx, "foreground")  # the old binary still runs: loaded, with the warning
    assert "cannot heal" in caplog.text and "changed since the context was compiled" in caplog.text
    assert [ep for ep, _ in sess.get_partitions()] == [EP]
    assert ctx.read_bytes() == before
    assert main(["check", str(ctx)]) == 1
    assert "self-heal: not possible: the source's file" in capsys.readouterr().out


@pytest.mark.slow
@requires("iree.runtime", "iree.compiler")
def test_source_elsewhere_through_context_source_model_path(
    stale: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ctx = _copy(stale, "aarch64", tmp_path)
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    for name in ("m_ctx.onnx", f"m_{EP}.bin"):
        shutil.move(ctx.parent / name, deploy / name)
    moved = deploy / "m_ctx.onnx"
    assert main(["check", str(moved)]) == 1
    assert "self-heal: not possible" in capsys.readouterr().out
    source = str(ctx.parent / "m.onnx")
    assert main(["check", str(moved), "--source", source]) == 1
    assert "a session with epctx.self_heal=foreground|background compiles it again" in capsys.readouterr().out
    sess = _session(moved, "foreground", **{"ep.context_source_model_path": source})
    assert [ep for ep, _ in sess.get_partitions()] == [EP]
    assert check_model(moved).status == Compat.EP_SUPPORTED_OPTIMAL


@pytest.mark.slow
@requires("iree.runtime", "iree.compiler")
def test_without_the_policy_nothing_changes(stale: dict[str, Path], tmp_path: Path) -> None:
    ctx = _copy(stale, "aarch64", tmp_path)
    before = ctx.read_bytes()
    with pytest.raises(epctx.errors.InvalidGraph, match="aarch64"):
        _session(ctx, None)
    assert ctx.read_bytes() == before
