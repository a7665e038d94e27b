"""Refit (``epctx refit CTX --weights SOURCE -o OUT``): an IREE context compiled for one model serves a model with
the same graph and other weights, made without compiling (under ``no_compile``); a graph, shape or compiled-in
value that differs is refused naming it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from benchmarks.models import mlp
from onnx import numpy_helper

import epctx
from epctx.cli import main
from epctx.epcontext import ContextBinary
from epctx.testing import no_compile
from tests.oracle import run_ort
from tests.requires import requires

pytestmark = [pytest.mark.slow, requires("iree.runtime", "iree.compiler")]

EP = "IREEExecutionProvider"


def _compile(source: Path, **config: str) -> tuple[Path, float]:
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    start = time.perf_counter()
    epctx.InferenceSession(str(source), so, providers=[EP])
    return source.with_name(f"{source.stem}_ctx.onnx"), time.perf_counter() - start


@pytest.fixture
def refit(monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, float]]:
    """``epctx refit`` in this process, with IREE's compile entry points made to fail: nothing may compile."""
    from epctx.providers.iree import compile, probing

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("a refit started an IREE compile")

    def run(ctx: Path, source: Path, out: Path, *extra: str) -> tuple[int, float]:
        with monkeypatch.context() as patch:
            patch.setattr(compile, "compile_partitions", refused)
            patch.setattr(probing, "check_nodes", refused)
            start = time.perf_counter()
            code = main(["refit", str(ctx), "--weights", str(source), "-o", str(out), *extra])
            return code, time.perf_counter() - start

    return run


def _run(ctx: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    with no_compile():
        sess = epctx.InferenceSession(str(ctx), providers=[EP])
    assert {ep for ep, _ in sess.get_partitions()} == {EP}
    return [np.asarray(x) for x in sess.run(None, feeds)]


def _mlp(
    folder: Path, sizes: tuple[int, ...] = (64, 128, 128, 10), tune: float = 0.0, small: bool = False
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    model = mlp(batch=4, sizes=sizes)
    if tune:
        rng = np.random.default_rng(7)
        for init in model.graph.initializer:
            array = numpy_helper.to_array(init)
            if array.size >= 1000 or small:  # the matrices; the biases too with ``small``
                moved = array + rng.standard_normal(array.shape).astype(array.dtype) * tune
                init.CopyFrom(numpy_helper.from_array(moved, init.name))
    path = folder / "m.onnx"
    onnx.save(model, path, save_as_external_data=True, location="m.onnx.data", size_threshold=1024)
    return path


@requires("torch")
def test_refit_a_torch_fine_tune_of_the_llm_pair(
    tmp_path: Path, refit: Callable[..., tuple[int, float]], capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks.llm_pair import SIZES, export_pair, prefill_feeds

    base, _ = export_pair(tmp_path / "base", "tiny", seed=3)
    tuned, _ = export_pair(tmp_path / "tuned", "tiny", seed=3, tune=0.05)
    ctx, compile_s = _compile(base)
    out = tmp_path / "tuned" / "prefill_ctx.onnx"
    code, refit_s = refit(ctx, tuned, out)
    assert code == 0, capsys.readouterr().err
    print(f"\nLLM pair tiny prefill: compile {compile_s:.2f} s, refit {refit_s:.2f} s")
    feeds = prefill_feeds(SIZES["tiny"], 8)
    got, expected = _run(out, feeds), run_ort(onnx.load(tuned), feeds)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-3)
    before = run_ort(onnx.load(base), feeds)[0]
    assert np.max(np.abs(before - expected[0])) > 1e-2  # the fine-tune did change the answer
    # The refit context runs the very code of the base one.
    with (
        ContextBinary.open(ctx.with_name(f"prefill_{EP}.bin")) as a,
        ContextBinary.open(out.with_name(f"prefill_{EP}.bin")) as b,
    ):
        modules = [n for n in a.names() if n.endswith("/module")]
        assert modules and [bytes(a.read(n)) for n in modules] == [bytes(b.read(n)) for n in modules]


@requires("torch")
def test_refit_refuses_a_changed_compiled_in_tensor(
    tmp_path: Path, refit: Callable[..., tuple[int, float]], capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks.llm_pair import export_pair

    base, _ = export_pair(tmp_path / "base", "tiny", seed=3)
    tuned, _ = export_pair(tmp_path / "tuned", "tiny", seed=3, tune=0.05, tune_norms=True)
    ctx, _ = _compile(base)
    code, _ = refit(ctx, tuned, tmp_path / "tuned" / "prefill_ctx.onnx")
    assert code == 1
    err = capsys.readouterr().err
    # torch's exporter shares identical initializers through Identity nodes: the norms, all ones at init, are
    # one tensor in the base model and several once tuned, so the graphs differ (else: a compiled-in tensor).
    assert "is not in the new model" in err or "is compiled into the code" in err, err
    assert not (tmp_path / "tuned" / "prefill_ctx.onnx").exists()


def test_refit_refuses_a_changed_small_tensor(
    tmp_path: Path, refit: Callable[..., tuple[int, float]], capsys: pytest.CaptureFixture[str]
) -> None:
    ctx, _ = _compile(_mlp(tmp_path / "base"))
    tuned = _mlp(tmp_path / "tuned", tune=0.01, small=True)
    code, _ = refit(ctx, tuned, tmp_path / "tuned" / "m_ctx.onnx")
    assert code == 1
    err = capsys.readouterr().err
    # the last bias (10 values) is under IREE's parameter threshold: a constant of the code
    assert "is compiled into the code" in err and "differs in the new model" in err, err


def test_refit_refuses_another_shape_naming_the_node(
    tmp_path: Path, refit: Callable[..., tuple[int, float]], capsys: pytest.CaptureFixture[str]
) -> None:
    ctx, _ = _compile(_mlp(tmp_path / "base"))
    other = _mlp(tmp_path / "wider", sizes=(64, 128, 256, 10))
    code, _ = refit(ctx, other, tmp_path / "wider" / "m_ctx.onnx")
    assert code == 1
    err = capsys.readouterr().err
    assert "differs from the compiled one" in err and "node '" in err, err


def test_refit_refuses_other_options(
    tmp_path: Path, refit: Callable[..., tuple[int, float]], capsys: pytest.CaptureFixture[str]
) -> None:
    ctx, _ = _compile(_mlp(tmp_path / "base"))
    tuned = _mlp(tmp_path / "tuned", tune=0.01)
    code, _ = refit(ctx, tuned, tmp_path / "tuned" / "m_ctx.onnx", "-p", f"{EP}:opt_level=O3")
    assert code == 1
    assert "pass the options it was compiled with" in capsys.readouterr().err


def test_weightless_refit_points_at_the_new_weights(
    tmp_path: Path, refit: Callable[..., tuple[int, float]], capsys: pytest.CaptureFixture[str]
) -> None:
    ctx, _ = _compile(_mlp(tmp_path / "base"), **{"ep.enable_weightless_mode": "1"})
    tuned = _mlp(tmp_path / "tuned", tune=0.01)
    out = tmp_path / "tuned" / "m_ctx.onnx"
    code, _ = refit(ctx, tuned, out)
    assert code == 0, capsys.readouterr().err
    metadata = {p.key: p.value for p in onnx.load(out, load_external_data=False).metadata_props}
    assert metadata["weightless_mode"] == "1"  # the context's mode, kept
    with ContextBinary.open(out.with_name(f"m_{EP}.bin")) as binary:
        [name] = [n for n in binary.names() if n.endswith("/meta")]
        meta = json.loads(bytes(binary.read(name)))
    assert [s["location"] for s in meta["sources"]] == ["m.onnx.data"] and len(meta["external"]) == 3
    feeds = {"input": np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)}
    np.testing.assert_allclose(_run(out, feeds)[0], run_ort(onnx.load(tuned), feeds)[0], rtol=1e-5, atol=1e-5)
    (tmp_path / "tuned" / "m.onnx.data").write_bytes((tmp_path / "base" / "m.onnx.data").read_bytes())
    with pytest.raises(epctx.errors.InvalidGraph, match="changed since the context was compiled"):
        _run(out, feeds)  # the base's weights put in place of the new ones: refused, not served
