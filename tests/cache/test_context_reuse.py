"""``epctx.context_reuse=1`` (the transparent cache next to the model): a session over a source model with
``ep.context_enable=1`` whose context model exists loads it when it was compiled from this source under this
session's key and its verdict is optimal, else compiles it again in place and serves it; without the key, the
session fails as onnxruntime 1.32 does ("exists already")."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import epctx
from epctx.cache.reuse import CONTEXT_KEY
from epctx.cache.scan import read_mapped, scan_model
from epctx.testing import no_compile
from tests.epcontext.models import EXAMPLE, feed, two_partition_model
from tests.oracle import run_ort


def _options(**config: str) -> epctx.SessionOptions:
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("epctx.context_reuse", "1")
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    return so


def _session(src: Path, so: epctx.SessionOptions, **ep_options: str) -> epctx.InferenceSession:
    return epctx.InferenceSession(str(src), so, providers=[(EXAMPLE, ep_options)])


def _check(sess: epctx.InferenceSession, model: onnx.ModelProto) -> None:
    np.testing.assert_allclose(sess.run(None, feed())[0], run_ort(model, feed())[0], atol=1e-5)


def _key(ctx: Path) -> str | None:
    return read_mapped(ctx, scan_model).metadata.get(CONTEXT_KEY)


def _source(tmp_path: Path, seed: int = 0) -> tuple[Path, Path]:
    src = tmp_path / "model.onnx"
    onnx.save(two_partition_model(seed=seed), src)
    return src, tmp_path / "model_ctx.onnx"


def test_without_reuse_an_existing_context_fails_as_onnxruntime_does(tmp_path: Path) -> None:
    src, ctx = _source(tmp_path)
    _session(src, _options())
    assert ctx.is_file()
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    with pytest.raises(epctx.Fail, match="exists already"):
        _session(src, so)
    ort_so = ort.SessionOptions()  # the peer: same refusal for an existing context path
    ort_so.add_session_config_entry("ep.context_enable", "1")
    with pytest.raises(Exception, match="exists already"):
        ort.InferenceSession(str(src), ort_so, providers=["CPUExecutionProvider"])


def test_an_unchanged_source_loads_the_existing_context(tmp_path: Path) -> None:
    src, ctx = _source(tmp_path)
    first = _session(src, _options())
    _check(first, two_partition_model())
    key, written = _key(ctx), ctx.stat().st_mtime_ns
    assert key is not None and len(key) == 32
    with no_compile():
        second = _session(src, _options())
    _check(second, two_partition_model())
    assert [ep for ep, _ in second.get_partitions()] == [EXAMPLE, "CPUExecutionProvider", EXAMPLE]
    assert ctx.stat().st_mtime_ns == written and _key(ctx) == key
    assert second.get_session_options().get_session_config_entry("epctx.context_reuse") == "1"


def test_a_source_edit_compiles_again_and_never_loads_the_stale_binary(tmp_path: Path) -> None:
    src, ctx = _source(tmp_path)
    _check(_session(src, _options()), two_partition_model())
    old_key = _key(ctx)
    onnx.save(two_partition_model(seed=5), src)  # same graph, other weights
    with pytest.raises(epctx.ModelRequiresCompilation), no_compile():
        _session(src, _options())  # the key differs: it must compile, never load the old binary
    sess = _session(src, _options())
    _check(sess, two_partition_model(seed=5))
    assert _key(ctx) not in (None, old_key)
    assert len(list(tmp_path.glob("*.bin"))) == 1  # the replaced generation's binary is gone
    with no_compile():
        _check(_session(src, _options()), two_partition_model(seed=5))


def test_an_option_change_compiles_again(tmp_path: Path) -> None:
    src, ctx = _source(tmp_path)
    _session(src, _options())
    first = _key(ctx)
    with pytest.raises(epctx.ModelRequiresCompilation), no_compile():
        _session(src, _options(), ops="MatMul,Relu")  # a provider option changes the binary
    _check(_session(src, _options(), ops="MatMul,Relu"), two_partition_model())
    second = _key(ctx)
    assert second not in (None, first)
    with pytest.raises(epctx.ModelRequiresCompilation), no_compile():
        _session(src, _options(**{"session.disable_cpu_ep_fallback": "0"}), ops="MatMul,Relu")
    with pytest.raises(epctx.ModelRequiresCompilation), no_compile():  # embedded binaries asked for now
        _session(src, _options(**{"ep.context_embed_mode": "1"}), ops="MatMul,Relu")


def test_a_context_without_a_key_or_unreadable_is_compiled_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src, ctx = _source(tmp_path)
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    _session(src, so)  # an ordinary generation: no key recorded
    assert ctx.is_file() and _key(ctx) is None
    with caplog.at_level(logging.INFO, logger="epctx"):
        _check(_session(src, _options()), two_partition_model())
    assert "records no cache key" in caplog.text and _key(ctx) is not None
    ctx.write_bytes(b"junk")
    _check(_session(src, _options()), two_partition_model())
    assert _key(ctx) is not None


def test_reuse_honours_the_context_file_path_and_is_off_with_a_cache_folder(tmp_path: Path) -> None:
    src, _ = _source(tmp_path)
    out = tmp_path / "out" / "elsewhere_ctx.onnx"
    _session(src, _options(**{"ep.context_file_path": str(out)}))
    assert _key(out) is not None
    with no_compile():
        _session(src, _options(**{"ep.context_file_path": str(out)}))
    cache = tmp_path / "cache"
    _session(src, _options(**{"ep.context_file_path": str(out), "epctx.context_cache": str(cache)}))
    assert any(cache.iterdir())  # the cache folder wins; the context path is not touched


def test_a_context_whose_verdict_is_not_optimal_is_compiled_again(tmp_path: Path) -> None:
    src, ctx = _source(tmp_path)
    _session(src, _options())
    key = _key(ctx)
    (tmp_path / f"model_{EXAMPLE}.bin").unlink()  # same key, but its binary is gone: UNSUPPORTED
    _check(_session(src, _options()), two_partition_model())
    assert _key(ctx) == key and (tmp_path / f"model_{EXAMPLE}.bin").is_file()


_CHILD = """
import logging, sys
import numpy as np
import epctx
from tests.epcontext.models import EXAMPLE, feed
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
so = epctx.SessionOptions()
so.add_session_config_entry("ep.context_enable", "1")
so.add_session_config_entry("epctx.context_reuse", "1")
sess = epctx.InferenceSession(sys.argv[1], so, providers=[EXAMPLE])
np.save(sys.argv[2], sess.run(None, feed())[0])
"""


@pytest.mark.slow
def test_concurrent_sessions_compile_the_context_once(tmp_path: Path) -> None:
    src, ctx = _source(tmp_path)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(src), str(tmp_path / f"out{k}.npy")],
            env=env,
            cwd=root,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(3)
    ]
    logs = [child.communicate(timeout=300)[1] for child in children]
    assert all(child.returncode == 0 for child in children), logs
    assert sum("wrote context model" in log for log in logs) == 1, logs
    assert sum("epctx.context_reuse: loading" in log for log in logs) == 2, logs
    expected = run_ort(two_partition_model(), feed())[0]
    for k in range(3):
        np.testing.assert_allclose(np.load(tmp_path / f"out{k}.npy"), expected, atol=1e-5)
    assert _key(ctx) is not None and len(list(tmp_path.glob("*.bin"))) == 1


def test_a_backend_or_epctx_upgrade_compiles_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import epctx.cache.key as key_module
    import epctx.providers.example.provider as example

    src, ctx = _source(tmp_path)
    _session(src, _options())
    keys = {_key(ctx)}
    monkeypatch.setattr(example, "PROGRAM_VERSION", 2)  # an upgraded backend
    with pytest.raises(epctx.ModelRequiresCompilation), no_compile():
        _session(src, _options())
    _check(_session(src, _options()), two_partition_model())
    keys.add(_key(ctx))
    monkeypatch.setattr(key_module, "__version__", "99.0")  # another epctx
    with pytest.raises(epctx.ModelRequiresCompilation), no_compile():
        _session(src, _options())
    _session(src, _options())
    keys.add(_key(ctx))
    assert len(keys) == 3 and None not in keys


@pytest.mark.slow
def test_reuse_on_a_real_model_with_openvino(tmp_path: Path) -> None:
    """magika's model (shipped in its wheel) on OpenVINO: compiled once, then loaded; the answers are
    onnxruntime's; an edited source (metadata only, same graph) is compiled again."""
    import importlib.util
    import shutil

    spec = importlib.util.find_spec("magika")
    shipped = (
        Path(spec.origin).parent / "models" / "standard_v3_3" / "model.onnx" if spec and spec.origin else None
    )
    if shipped is None or not shipped.is_file():
        pytest.skip("magika does not ship models/standard_v3_3/model.onnx")
    src, ctx = tmp_path / "model.onnx", tmp_path / "model_ctx.onnx"
    shutil.copy(shipped, src)
    x = {"bytes": np.random.default_rng(0).integers(0, 257, (2, 2048)).astype(np.int32)}
    expected = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, x)[0]
    ov = ["OpenVINOExecutionProvider"]
    first = epctx.InferenceSession(str(src), _options(), providers=ov)
    np.testing.assert_allclose(first.run(None, x)[0], expected, atol=1e-4)
    with no_compile():
        second = epctx.InferenceSession(str(src), _options(), providers=ov)
    np.testing.assert_allclose(second.run(None, x)[0], expected, atol=1e-4)
    key = _key(ctx)
    edited = onnx.load(str(src))
    edited.doc_string = "edited"
    onnx.save(edited, str(src))
    with pytest.raises(epctx.ModelRequiresCompilation), no_compile():
        epctx.InferenceSession(str(src), _options(), providers=ov)
    epctx.InferenceSession(str(src), _options(), providers=ov)
    assert _key(ctx) not in (None, key)
