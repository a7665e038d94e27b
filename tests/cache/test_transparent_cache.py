"""The transparent cache (``epctx.context_cache``): the second session loads what the first compiled; every
change that changes the binary gives another key (never a stale binary); a context whose verdict is not
optimal is compiled again; a kill during a cache write leaves nothing half served; concurrent first runs
compile once. ``epctx cache``: tests/cli/test_cache.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

import epctx
from epctx.cache.store import ContextCache
from epctx.testing import no_compile
from tests.epcontext.models import EXAMPLE, feed, two_partition_model
from tests.oracle import run_ort

ROOT = Path(__file__).resolve().parents[2]


def _options(cache: Path, **config: str) -> epctx.SessionOptions:
    so = epctx.SessionOptions()
    so.add_session_config_entry("epctx.context_cache", str(cache))
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    return so


def _session(src: Path | bytes, so: epctx.SessionOptions, **ep_options: str) -> epctx.InferenceSession:
    return epctx.InferenceSession(
        src if isinstance(src, bytes) else str(src), so, providers=[(EXAMPLE, ep_options)]
    )


def _keys(cache: Path) -> set[str]:
    return {e.key for e in ContextCache(cache).entries()}


def _check(sess: epctx.InferenceSession, model: onnx.ModelProto) -> None:
    np.testing.assert_allclose(sess.run(None, feed())[0], run_ort(model, feed())[0], atol=1e-5)


def test_the_second_session_loads_what_the_first_compiled(tmp_path: Path) -> None:
    src, cache = tmp_path / "model.onnx", tmp_path / "cache"
    onnx.save(two_partition_model(), src)
    first = _session(src, _options(cache))
    _check(first, two_partition_model())
    (key,) = _keys(cache)
    with no_compile():
        second = _session(src, _options(cache))
    _check(second, two_partition_model())
    assert [ep for ep, _ in second.get_partitions()] == [EXAMPLE, "CPUExecutionProvider", EXAMPLE]
    assert second.get_session_options().get_session_config_entry("epctx.context_cache") == str(cache)
    with no_compile():  # the same model given as bytes: the same key
        _check(_session(src.read_bytes(), _options(cache)), two_partition_model())
    assert _keys(cache) == {key} and len(ContextCache(cache).entry(key).info().generations) == 1
    assert not any(p.suffix in (".bin",) or p.name.endswith("_ctx.onnx") for p in tmp_path.iterdir())


def test_a_writer_killed_after_switching_current_leaves_nothing_for_long(tmp_path: Path) -> None:
    """A kill between writing CURRENT and removing the other generations leaves them; the next session that
    loads the entry removes them (unless a writer holds the key's lock, then it leaves them to that one)."""
    src, cache = tmp_path / "model.onnx", tmp_path / "cache"
    onnx.save(two_partition_model(), src)
    _session(src, _options(cache))
    (entry,) = ContextCache(cache).entries()
    served = entry.info().current
    leftovers = [entry.folder / "g1-111", entry.folder / "g2-222"]
    for folder in leftovers:
        folder.mkdir()
        (folder / "model_ctx.onnx").write_bytes(b"half")
    with entry.locked():  # another process writes: the reader leaves the folders alone
        with no_compile():
            _check(_session(src, _options(cache)), two_partition_model())
        assert all(folder.is_dir() for folder in leftovers)
    with no_compile():
        _check(_session(src, _options(cache)), two_partition_model())
    assert entry.info().generations == (served,) and entry.info().current == served


def test_editing_the_source_gives_another_key(tmp_path: Path) -> None:
    src, cache = tmp_path / "model.onnx", tmp_path / "cache"
    onnx.save(two_partition_model(), src)
    _session(src, _options(cache))
    before = src.stat()
    onnx.save(two_partition_model(seed=5), src)  # same graph, other weights: same size
    os.utime(src, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the old date: the digest memo sees ctime
    assert src.stat().st_size == before.st_size and src.stat().st_mtime_ns == before.st_mtime_ns
    with pytest.raises(epctx.ModelRequiresCompilation), no_compile():
        _session(src, _options(cache))
    sess = _session(src, _options(cache))
    _check(sess, two_partition_model(seed=5))
    assert len(_keys(cache)) == 2


def test_editing_the_external_data_gives_another_key(tmp_path: Path) -> None:
    src, cache = tmp_path / "model.onnx", tmp_path / "cache"
    onnx.save(two_partition_model(), src, save_as_external_data=True, location="w.data", size_threshold=0)
    _session(src, _options(cache))
    edited = two_partition_model(seed=3)
    (tmp_path / "edited").mkdir()
    onnx.save(
        edited,
        tmp_path / "edited" / "model.onnx",
        save_as_external_data=True,
        location="w.data",
        size_threshold=0,
    )
    assert (tmp_path / "edited" / "model.onnx").read_bytes() == src.read_bytes()  # the model file is the same
    (tmp_path / "w.data").write_bytes((tmp_path / "edited" / "w.data").read_bytes())  # its weights are not
    with pytest.raises(epctx.ModelRequiresCompilation), no_compile():
        _session(src, _options(cache))
    _check(_session(src, _options(cache)), two_partition_model(seed=3))
    assert len(_keys(cache)) == 2


def test_options_backend_and_epctx_versions_are_in_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, cache = tmp_path / "model.onnx", tmp_path / "cache"
    onnx.save(two_partition_model(), src)
    _session(src, _options(cache))
    changes = [
        lambda: _session(src, _options(cache), ops="MatMul,Relu"),  # a provider option
        lambda: _session(
            src, _options(cache, **{"session.disable_cpu_ep_fallback": "0"})
        ),  # a session option
    ]
    so = _options(cache)
    so.add_free_dimension_override_by_name("N", 3)
    changes.append(lambda: _session(src, so))
    for change in changes:
        with pytest.raises(epctx.ModelRequiresCompilation), no_compile():
            change()
        change()
    assert len(_keys(cache)) == 4
    # Options that only say how or whether to compile share the key.
    with no_compile():
        _session(src, _options(cache, **{"session.disable_model_compile": "1"}))
    import epctx.cache.key as key_module
    import epctx.providers.example.provider as example

    monkeypatch.setattr(example, "PROGRAM_VERSION", 2)  # an upgraded backend
    with pytest.raises(epctx.ModelRequiresCompilation), no_compile():
        _session(src, _options(cache))
    _check(_session(src, _options(cache)), two_partition_model())
    monkeypatch.setattr(key_module, "__version__", "99.0")  # another epctx
    with pytest.raises(epctx.ModelRequiresCompilation), no_compile():
        _session(src, _options(cache))


def test_a_cached_context_that_no_longer_loads_well_is_compiled_again(tmp_path: Path) -> None:
    src, cache = tmp_path / "model.onnx", tmp_path / "cache"
    onnx.save(two_partition_model(), src)
    _session(src, _options(cache))
    (entry,) = ContextCache(cache).entries()
    current = entry.current()
    assert current is not None
    (current.parent / f"model_{EXAMPLE}.bin").unlink()  # its binary is gone: check says UNSUPPORTED
    _check(_session(src, _options(cache)), two_partition_model())
    renewed = entry.current()
    assert renewed is not None and renewed.parent != current.parent and not current.parent.exists()


_CHILD = """
import sys, numpy as np, onnx, epctx
from benchmarks.models import mlp
so = epctx.SessionOptions()
so.add_session_config_entry("epctx.context_cache", sys.argv[1])
# no timing in what is cached: the measured rule, under a loaded machine, can hand the partition back (nothing
# compiled, nothing cached), which once failed the kill test's last check
so.add_session_config_entry("epctx.partition.measured_rule", "0")
sess = epctx.InferenceSession(sys.argv[2], so, providers=["ExampleExecutionProvider"])
x = np.ones((2, 256), np.float32)
np.save(sys.argv[3], sess.run(None, {sess.get_inputs()[0].name: x})[0])
"""


def _child(cache: Path, src: Path, out: Path, *, log: bool = False) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    script = ("import logging; logging.basicConfig(level=logging.INFO)\n" if log else "") + _CHILD
    return subprocess.Popen(
        [sys.executable, "-c", script, str(cache), str(src), str(out)], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


@pytest.fixture
def big_model(tmp_path: Path) -> tuple[Path, np.ndarray]:
    from benchmarks.models import mlp

    model = mlp(batch=2, sizes=(256, 2048, 2048, 2048, 10))  # 33 MB of weights: writing takes a while
    src = tmp_path / "big.onnx"
    onnx.save(model, src)
    expected = run_ort(model, {model.graph.input[0].name: np.ones((2, 256), np.float32)})[0]
    return src, expected


@pytest.mark.slow
def test_a_kill_during_a_cache_write_never_leaves_a_half_generation_served(
    tmp_path: Path, big_model: tuple[Path, np.ndarray]
) -> None:
    src, expected = big_model
    started = time.perf_counter()
    whole = _child(tmp_path / "timing", src, tmp_path / "out.npy")
    assert whole.wait(timeout=300) == 0, whole.communicate()[1]
    took = time.perf_counter() - started  # a whole first run: the kills below land all along it
    cache = tmp_path / "cache"
    killed_mid_write = 0
    for fraction in (0.3, 0.45, 0.6, 0.7, 0.8, 0.9, 0.97):
        child = _child(cache, src, tmp_path / "out.npy")
        time.sleep(took * fraction)
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
        for entry in ContextCache(cache).entries():
            current = entry.current()
            generations = [p for p in entry.folder.iterdir() if p.is_dir()]
            killed_mid_write += current is None and bool(generations)
            if current is not None:  # whatever CURRENT names is complete and right
                with no_compile():
                    sess = epctx.InferenceSession(str(current), providers=[EXAMPLE])
                x = np.ones((2, 256), np.float32)
                np.testing.assert_allclose(
                    sess.run(None, {sess.get_inputs()[0].name: x})[0], expected, atol=1e-4
                )
    assert killed_mid_write, f"no kill landed during a cache write (a first run took {took:.2f} s)"
    done = _child(cache, src, tmp_path / "out.npy")
    assert done.wait(timeout=300) == 0, done.communicate()[1]
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected, atol=1e-4)
    (entry,) = ContextCache(cache).entries()
    assert len(entry.info().generations) == 1  # the killed writers' folders went with the commit


@pytest.mark.slow
def test_concurrent_first_runs_compile_once(tmp_path: Path, big_model: tuple[Path, np.ndarray]) -> None:
    src, expected = big_model
    cache = tmp_path / "cache"
    children = [_child(cache, src, tmp_path / f"out{k}.npy", log=True) for k in range(3)]
    logs = []
    for child in children:
        _, err = child.communicate(timeout=300)
        assert child.returncode == 0, err
        logs.append(err)
    assert sum("compiling into" in log for log in logs) == 1, logs
    assert sum("loading" in log for log in logs) == 2
    for k in range(3):
        np.testing.assert_allclose(np.load(tmp_path / f"out{k}.npy"), expected, atol=1e-4)
    (entry,) = ContextCache(cache).entries()
    assert len(entry.info().generations) == 1


def test_nothing_to_compile_is_said_at_info_not_warned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    src, cache = tmp_path / "model.onnx", tmp_path / "cache"
    onnx.save(two_partition_model(), src)
    with caplog.at_level(logging.INFO, logger="epctx"):
        sess = epctx.InferenceSession(str(src), _options(cache), providers=["CPUExecutionProvider"])
    _check(sess, two_partition_model())
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "nothing was compiled" in caplog.text
