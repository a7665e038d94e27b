"""The compile API (ModelCompiler) as EP_CONTEXT_SPEC.md's "Compile API" section describes it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import epctx
from epctx.session.compile_guard import no_compile
from tests.epcontext.models import EXAMPLE, feed, two_partition_model
from tests.oracle import run_ort


def _so(*providers: str) -> epctx.SessionOptions:
    so = epctx.SessionOptions()
    for name in providers:
        so.add_provider(name, {})
    return so


def _run(model: Path | bytes) -> np.ndarray:
    with no_compile():
        sess = epctx.InferenceSession(model if isinstance(model, bytes) else str(model), providers=[EXAMPLE])
    return sess.run(None, feed())[0]


@pytest.fixture
def src(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx"
    onnx.save(two_partition_model(), path)
    return path


def _expected() -> np.ndarray:
    return run_ort(two_partition_model(), feed())[0]


def test_compile_to_file_default_and_explicit_path(src):
    epctx.ModelCompiler(_so(EXAMPLE), str(src)).compile_to_file()
    assert (src.parent / "model_ctx.onnx").is_file() and (src.parent / f"model_{EXAMPLE}.bin").is_file()
    np.testing.assert_allclose(_run(src.parent / "model_ctx.onnx"), _expected(), atol=1e-5)
    out = src.parent / "sub" / "out.onnx"
    epctx.ModelCompiler(_so(EXAMPLE), str(src), embed_compiled_data_into_model=True).compile_to_file(str(out))
    assert sorted(p.name for p in out.parent.iterdir()) == ["out.onnx"]
    np.testing.assert_allclose(_run(out), _expected(), atol=1e-5)


def test_compile_from_bytes_to_bytes_and_stream(src):
    data = src.read_bytes()
    out = epctx.ModelCompiler(_so(EXAMPLE), data).compile_to_bytes()
    np.testing.assert_allclose(_run(out), _expected(), atol=1e-5)
    chunks: list[bytes] = []
    epctx.ModelCompiler(_so(EXAMPLE), data).compile_to_stream(chunks.append)
    assert b"".join(chunks) == out


def test_stream_gets_chunks_not_one_copy(src):
    # A model over 1 MiB reaches the write function in several chunks.
    rng = np.random.default_rng(0)
    big = two_partition_model()
    extra = onnx.numpy_helper.from_array(rng.standard_normal((512, 1024)).astype(np.float32), "big")
    big.graph.initializer.append(extra)
    big.graph.node.append(
        onnx.helper.make_node("LayerNormalization", ["big", "big_s", "big_b"], ["z"], axis=-1)
    )
    big.graph.initializer.extend(
        [
            onnx.numpy_helper.from_array(np.ones(1024, np.float32), "big_s"),
            onnx.numpy_helper.from_array(np.zeros(1024, np.float32), "big_b"),
        ]
    )
    big.graph.output.append(onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [512, 1024]))
    sizes: list[int] = []
    epctx.ModelCompiler(_so(EXAMPLE), big.SerializeToString()).compile_to_stream(
        lambda b: sizes.append(len(b))
    )
    assert len(sizes) >= 2 and max(sizes) <= 1 << 20


def test_flags(src):
    out = src.parent / "o.onnx"
    out.write_bytes(b"old")
    epctx.ModelCompiler(_so(EXAMPLE), str(src)).compile_to_file(str(out))  # default: overwrite
    assert out.read_bytes() != b"old"
    with pytest.raises(epctx.Fail, match="exists"):
        epctx.ModelCompiler(
            _so(EXAMPLE), str(src), flags=epctx.CompileFlags.ERROR_IF_OUTPUT_FILE_EXISTS
        ).compile_to_file(str(out))
    cpu_only = src.parent / "cpu.onnx"
    with pytest.raises(epctx.Fail, match="Unable to compile any nodes"):
        epctx.ModelCompiler(
            _so(), str(src), flags=epctx.CompileFlags.ERROR_IF_NO_NODES_COMPILED
        ).compile_to_file(str(cpu_only))
    assert not cpu_only.exists()
    # Without the flag the model is written (it runs on the CPU EP).
    epctx.ModelCompiler(_so(), str(src)).compile_to_file(str(cpu_only))
    (out_cpu,) = epctx.InferenceSession(str(cpu_only)).run(None, feed())
    np.testing.assert_allclose(out_cpu, _expected(), atol=1e-5)


def test_empty_inputs_are_value_errors():
    with pytest.raises(ValueError, match="empty"):
        epctx.ModelCompiler(_so(EXAMPLE), b"")
    with pytest.raises(ValueError, match="empty"):
        epctx.ModelCompiler(_so(EXAMPLE), "")


def test_external_initializers_by_threshold(src):
    out = src.parent / "t.onnx"
    epctx.ModelCompiler(
        _so(EXAMPLE),
        str(src),
        external_initializers_file_path="t.data",
        external_initializers_size_threshold=32,
    ).compile_to_file(str(out))
    model = onnx.load(out, load_external_data=False)
    kinds = {i.name: i.data_location for i in model.graph.initializer}
    assert kinds == {"ln_scale": onnx.TensorProto.EXTERNAL, "ln_bias": onnx.TensorProto.EXTERNAL}
    assert (src.parent / "t.data").is_file()
    np.testing.assert_allclose(_run(out), _expected(), atol=1e-5)


def test_initializer_location_callback_keep_reuse_and_new_file(tmp_path):
    folder = tmp_path
    onnx.save(two_partition_model(), folder / "ext.onnx", save_as_external_data=True, location="ext.data",
              size_threshold=0)  # fmt: skip
    seen: dict[str, object] = {}

    def reuse(name, value, info):
        seen[name] = info
        return info  # reuse the source's external file

    out = folder / "reuse_ctx.onnx"
    epctx.ModelCompiler(
        _so(EXAMPLE), str(folder / "ext.onnx"), get_initializer_location_func=reuse
    ).compile_to_file(str(out))
    assert isinstance(seen["ln_scale"], epctx.ExternalInitializerInfo)
    model = onnx.load(out, load_external_data=False)
    locations = {
        i.name: {e.key: e.value for e in i.external_data}["location"] for i in model.graph.initializer
    }
    assert locations == {"ln_scale": "ext.data", "ln_bias": "ext.data"}
    np.testing.assert_allclose(_run(out), _expected(), atol=1e-5)

    out2 = folder / "keep_ctx.onnx"
    epctx.ModelCompiler(
        _so(EXAMPLE), str(folder / "ext.onnx"), get_initializer_location_func=lambda n, v, i: None
    ).compile_to_file(str(out2))
    assert all(
        i.data_location != onnx.TensorProto.EXTERNAL
        for i in onnx.load(out2, load_external_data=False).graph.initializer
    )

    new_file = folder / "new.data"
    offsets: dict[str, int] = {}

    def to_new_file(name, value, info):
        raw = np.ascontiguousarray(value).tobytes()
        offset = new_file.stat().st_size if new_file.exists() else 0
        with new_file.open("ab") as fh:
            fh.write(raw)
        offsets[name] = offset
        return epctx.ExternalInitializerInfo("new.data", offset, len(raw))

    out3 = folder / "new_ctx.onnx"
    epctx.ModelCompiler(
        _so(EXAMPLE), str(folder / "ext.onnx"), get_initializer_location_func=to_new_file
    ).compile_to_file(str(out3))
    np.testing.assert_allclose(_run(out3), _expected(), atol=1e-5)


def test_callback_and_write_errors_surface_as_fail(src):
    def boom(name, value, info):
        raise RuntimeError("callback exploded")

    with pytest.raises(epctx.Fail, match="callback exploded"):
        epctx.ModelCompiler(_so(EXAMPLE), str(src), get_initializer_location_func=boom).compile_to_file(
            str(src.parent / "x.onnx")
        )

    def bad_write(chunk: bytes) -> None:
        raise OSError("disk full")

    with pytest.raises(epctx.Fail, match="disk full"):
        epctx.ModelCompiler(_so(EXAMPLE), str(src)).compile_to_stream(bad_write)


def test_over_2gb_to_bytes_or_stream_fails_clearly(src, monkeypatch):
    import epctx.compiler

    monkeypatch.setattr(epctx.compiler, "_TWO_GB", 64)  # stand-in for 2 GB: the check, not the allocation
    with pytest.raises(epctx.Fail, match="2 GB"):
        epctx.ModelCompiler(_so(EXAMPLE), str(src)).compile_to_bytes()
    with pytest.raises(epctx.Fail, match="2 GB"):
        epctx.ModelCompiler(_so(EXAMPLE), str(src)).compile_to_stream(lambda chunk: None)


def _snapshot(so: epctx.SessionOptions) -> dict[str, str]:
    return {name: repr(getattr(so, name)) for name in type(so).__slots__}


def test_the_callers_session_options_are_never_changed(src, monkeypatch):
    """ModelCompiler compiles at its own graph_optimization_level (ORT_DISABLE_ALL by default) without setting it
    on the caller's options, not even while it compiles (another thread may create a session with them)."""
    from epctx.session.pipeline import Pipeline

    so = _so(EXAMPLE)
    so.graph_optimization_level = epctx.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("ep.context_embed_mode", "0")
    before = _snapshot(so)
    during: list[dict[str, str]] = []
    make = Pipeline.of.__func__  # type: ignore[attr-defined]

    def spy(cls, providers, options, **kwargs):
        during.append(_snapshot(options))
        assert options is so
        assert kwargs["optimization_level"] == epctx.GraphOptimizationLevel.ORT_DISABLE_ALL  # the compiler's
        return make(cls, providers, options, **kwargs)

    monkeypatch.setattr(Pipeline, "of", classmethod(spy))
    epctx.ModelCompiler(so, str(src)).compile_to_file()
    epctx.ModelCompiler(so, src.read_bytes(), embed_compiled_data_into_model=True).compile_to_bytes()
    assert during == [before, before]
    assert _snapshot(so) == before
