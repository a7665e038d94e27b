"""Generation is one transaction: kills leave the previous or the new state, concurrent writers are serialised,
stale temporary files go, modes follow the umask, outputs that cannot be written are refused before compiling."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from benchmarks.kill_loop import kill_loop

import epctx
from epctx.epcontext import generate
from epctx.errors import Fail
from epctx.session.compile_guard import no_compile
from tests.epcontext.models import EXAMPLE, feed, two_partition_model
from tests.oracle import run_ort

ROOT = Path(__file__).resolve().parents[2]


def _compiler(source: Path | bytes, **kwargs: object) -> epctx.ModelCompiler:
    so = epctx.SessionOptions()
    so.add_provider(EXAMPLE, {})
    return epctx.ModelCompiler(so, source if isinstance(source, bytes) else str(source), **kwargs)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["single", "group", "fresh"])
def test_kill_at_random_moments_never_leaves_a_loadable_mixture(tmp_path, mode):
    outcomes = kill_loop(tmp_path, mode, kills=6, seed=1)
    print(f"{mode}: {dict(outcomes)}")
    assert set(outcomes) <= {"ok", "absent"}, outcomes
    # The next generation removes the temporary files of killed ones and the previous generation's files.
    from benchmarks.kill_loop import generate as regenerate

    regenerate(tmp_path, mode, 0)
    left = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    count = 2 if mode == "group" else 1
    assert not [n for n in left if n.endswith(".tmp")], left
    assert len([n for n in left if n.endswith(".bin")]) == (1 if mode == "group" else 2), left
    assert len([n for n in left if n.endswith("_ctx.onnx")]) == count, left


def test_overwrite_replaces_and_removes_the_previous_files(tmp_path):
    sources = []
    for seed in (0, 1):
        sources.append(tmp_path / f"src{seed}.onnx")
        onnx.save(two_partition_model(seed), sources[-1])
    out = tmp_path / "out" / "model_ctx.onnx"
    for seed in (0, 1, 0):
        _compiler(sources[seed]).compile_to_file(str(out))
        with no_compile():
            got = epctx.InferenceSession(str(out), providers=[EXAMPLE]).run(None, feed())[0]
        np.testing.assert_allclose(got, run_ort(two_partition_model(seed), feed())[0], atol=1e-5)
        assert len(list(out.parent.iterdir())) == 2  # the model and its one binary


@pytest.mark.slow
def test_concurrent_writers_of_one_path_are_serialised(tmp_path):
    for seed in (0, 1):
        onnx.save(two_partition_model(seed), tmp_path / f"src{seed}.onnx")
    script = textwrap.dedent(
        """
        import sys
        import epctx
        so = epctx.SessionOptions()
        so.add_provider("ExampleExecutionProvider", {})
        for _ in range(8):
            epctx.ModelCompiler(so, sys.argv[1]).compile_to_file(sys.argv[2])
        """
    )
    out = tmp_path / "out.onnx"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    writers = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path / f"src{seed}.onnx"), str(out)], env=env)
        for seed in (0, 1)
    ]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    with no_compile():
        got = epctx.InferenceSession(str(out), providers=[EXAMPLE]).run(None, feed())[0]
    assert any(np.allclose(got, run_ort(two_partition_model(s), feed())[0], atol=1e-5) for s in (0, 1))
    assert len([p for p in tmp_path.iterdir() if p.suffix == ".bin"]) == 1


def test_stale_temporary_files_of_dead_writers_are_removed(tmp_path):
    onnx.save(two_partition_model(), tmp_path / "model.onnx")
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / f".model_ctx.onnx.{int(dead.stdout)}.0123456789ab.tmp"
    alive = tmp_path / f".model_ctx.onnx.{os.getpid()}.0123456789ab.tmp"
    stale.write_bytes(b"x" * 1000)
    alive.write_bytes(b"y")
    _compiler(tmp_path / "model.onnx").compile_to_file(str(tmp_path / "model_ctx.onnx"))
    assert not stale.exists()
    assert alive.exists()  # a live writer's file is never touched


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_written_files_follow_the_umask(tmp_path, umask):
    onnx.save(two_partition_model(), tmp_path / "model.onnx")
    old = os.umask(umask)
    try:
        _compiler(
            tmp_path / "model.onnx",
            external_initializers_file_path="w.bin",
            external_initializers_size_threshold=0,
        ).compile_to_file(str(tmp_path / "out" / "model_ctx.onnx"))
    finally:
        os.umask(old)
    files = list((tmp_path / "out").iterdir())
    assert len(files) == 3
    for path in files:
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, path.name


def test_error_if_output_exists_is_checked_before_compiling(tmp_path):
    onnx.save(two_partition_model(), tmp_path / "model.onnx")
    (tmp_path / "model_ctx.onnx").write_bytes(b"keep me")
    compiler = _compiler(tmp_path / "model.onnx", flags=epctx.CompileFlags.ERROR_IF_OUTPUT_FILE_EXISTS)
    with no_compile(), pytest.raises(Fail, match="exists already"):  # no_compile: raising later would compile
        compiler.compile_to_file(str(tmp_path / "model_ctx.onnx"))
    assert (tmp_path / "model_ctx.onnx").read_bytes() == b"keep me"


def test_outputs_over_2gb_are_refused_before_compiling(tmp_path):
    # A model whose initializer lives in a sparse 2 GiB external file: refused in well under a second, before
    # anything is read or compiled.
    weights = tmp_path / "weights.bin"
    with open(weights, "wb") as fh:
        fh.truncate(2**31)
    model = two_partition_model()
    big = onnx.TensorProto(name="big", data_type=onnx.TensorProto.FLOAT, dims=[2**29])
    big.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", "weights.bin"), ("offset", "0"), ("length", str(2**31))):
        big.external_data.add(key=key, value=value)
    model.graph.initializer.append(big)
    onnx.save(model, tmp_path / "model.onnx")
    for call in ("compile_to_bytes", "compile_to_stream"):
        started = time.perf_counter()
        with no_compile(), pytest.raises(Fail, match="2 GB"):
            compiler = _compiler(tmp_path / "model.onnx", embed_compiled_data_into_model=True)
            getattr(compiler, call)(*([lambda b: None] if call == "compile_to_stream" else []))
        assert time.perf_counter() - started < 5


def test_embedded_binaries_over_the_limit_are_refused_before_assembly(tmp_path, monkeypatch):
    onnx.save(two_partition_model(), tmp_path / "model.onnx")
    monkeypatch.setattr(generate, "_TWO_GB", 1000)  # the example model's binary is a few KB
    with pytest.raises(Fail, match="2 GB limit; write the binaries to files"):
        _compiler(tmp_path / "model.onnx", embed_compiled_data_into_model=True).compile_to_bytes()


def test_a_failed_commit_leaves_no_new_file_behind(tmp_path, monkeypatch):
    from epctx.epcontext import transaction

    onnx.save(two_partition_model(), tmp_path / "model.onnx")
    real = transaction.write_file_atomic

    def failing(path, write):
        if path.suffix == ".onnx":
            raise Fail("disk full (simulated)")
        real(path, write)

    monkeypatch.setattr(transaction, "write_file_atomic", failing)
    compiler = _compiler(
        tmp_path / "model.onnx",
        external_initializers_file_path="w.bin",
        external_initializers_size_threshold=0,
    )
    with pytest.raises(Fail, match="simulated"):
        compiler.compile_to_file(str(tmp_path / "model_ctx.onnx"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def test_files_of_other_programs_are_never_removed(tmp_path):
    # A user's file whose name looks content-derived, and one under the name an external file would take.
    onnx.save(two_partition_model(), tmp_path / "model.onnx")
    theirs = tmp_path / "holiday.0123456789ab.jpg"
    theirs.write_bytes(b"not epctx's")
    for _ in range(2):
        _compiler(tmp_path / "model.onnx").compile_to_file(str(tmp_path / "model_ctx.onnx"))
    assert theirs.read_bytes() == b"not epctx's"
