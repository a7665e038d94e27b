"""The benchmark's LLM pair (``benchmarks/llm_pair.py``, tiny size) on the IREE EP: a prefill and a decode model
exported with torch over one set of weights, compiled together with ``ep.share_ep_contexts`` into one weights
file, loaded without compiling, run as a two-step generation against onnxruntime. Skipped without IREE or torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from benchmarks.llm_pair import SIZES, decode_feeds, export_pair, prefill_feeds

import epctx
from epctx.epcontext.container import ContextBinary
from epctx.testing import no_compile
from tests.oracle import run_ort
from tests.requires import requires

# Compiles with IREE, exports with torch or runs many whole models: `make test-fast` leaves it out.
pytestmark = [pytest.mark.slow, requires("iree.runtime", "iree.compiler", "torch")]

EP = "IREEExecutionProvider"
SHARE = {"ep.share_ep_contexts": "1"}


def _options(k: int, **entries: str) -> epctx.SessionOptions:
    so = epctx.SessionOptions()
    for key, value in {**SHARE, "ep.stop_share_ep_contexts": str(k), **entries}.items():
        so.add_session_config_entry(key, value)
    return so


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("llm")
    prefill, decode = export_pair(folder, "tiny", seed=3)
    for k, source in enumerate((prefill, decode)):
        sess = epctx.InferenceSession(str(source), _options(k, **{"ep.context_enable": "1"}), providers=[EP])
        assert {ep for ep, _ in sess.get_partitions()} == {EP}, sess.get_partitions()
    return prefill, decode


def test_the_pair_is_one_weights_file_holding_each_weight_once(pair: tuple[Path, Path]) -> None:
    prefill, _ = pair
    folder = prefill.parent
    (binary,) = folder.glob("*.bin")
    model = onnx.load(prefill)
    weights = {onnx.numpy_helper.to_array(t).tobytes() for t in model.graph.initializer}
    with ContextBinary.open(binary) as opened:
        entries = [opened.entry(n) for n in opened.names()]
        stored = {(e.offset, e.size) for e in entries if e.kind == "weights"}
        code = sum(e.size for e in entries if e.kind != "weights")
    # every weight of the decode model is one the prefill model stored: the stored weights are one model's
    assert sum(size for _, size in stored) <= sum(len(w) for w in weights)
    assert binary.stat().st_size <= 1.05 * (sum(len(w) for w in weights) + code)


def test_prefill_then_decode_match_onnxruntime_without_compiling(pair: tuple[Path, Path]) -> None:
    prefill, decode = pair
    config = SIZES["tiny"]
    with no_compile():
        sessions = [
            epctx.InferenceSession(str(p.with_name(f"{p.stem}_ctx.onnx")), _options(k), providers=[EP])
            for k, p in enumerate((prefill, decode))
        ]
    feed = prefill_feeds(config, 12)
    got, want = sessions[0].run(None, feed), run_ort(onnx.load(prefill), feed)
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(got, want)) <= 1e-4
    token = int(np.argmax(want[0][0, -1]))
    got = sessions[1].run(None, decode_feeds(config, got, token))
    want = run_ort(onnx.load(decode), decode_feeds(config, want, token))
    assert got[1].shape == (1, config.kv_heads, 13, config.head_dim)
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(got, want)) <= 1e-4
