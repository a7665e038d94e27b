"""The benchmark's LLM pair (``benchmarks/llm_pair.py``, tiny) on the CPU EP, as a generation runs it: a prefill,
then decode steps whose past grows by one each (a new shape signature for the shape memo at every step), then
earlier lengths again (memo hits), every step against onnxruntime; and which chains and memos the plan holds
(issue 21: the CPU EP's per-node cost). Exports with torch: slow tier."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from benchmarks.llm_pair import SIZES, decode_feeds, export_pair, prefill_feeds

import epctx
from epctx.session.plan_memo import ShapeMemo
from tests.oracle import run_ort
from tests.requires import requires

pytestmark = [pytest.mark.slow, requires("torch")]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return export_pair(tmp_path_factory.mktemp("llm"), "tiny", seed=5)


def _err(ours: list[np.ndarray], theirs: list[np.ndarray]) -> float:
    assert [a.shape for a in ours] == [b.shape for b in theirs]
    return max(float(np.max(np.abs(a - b))) for a, b in zip(ours, theirs))


def test_a_generation_matches_onnxruntime_as_the_past_grows_and_comes_back(pair: tuple[Path, Path]) -> None:
    config = SIZES["tiny"]
    sessions = [epctx.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in pair]
    models = [onnx.load(p) for p in pair]
    feed = prefill_feeds(config, 7)
    ours = sessions[0].run(None, feed)
    assert _err(ours, run_ort(models[0], feed)) <= 1e-4
    feeds = []
    for _ in range(6):  # past 7, 8, ... 12: a new signature each step
        token = int(np.argmax(ours[0][0, -1]))
        feeds.append(decode_feeds(config, ours, token))
        ours = sessions[1].run(None, feeds[-1])
        assert _err(ours, run_ort(models[1], feeds[-1])) <= 1e-4
    memos = [fn for fn, *_ in sessions[1]._plan.steps if isinstance(fn, ShapeMemo)]
    assert memos and all(len(m.cache) == 6 for m in memos)
    for earlier in (feeds[2], feeds[0]):  # lengths seen before: looked up
        assert _err(sessions[1].run(None, earlier), run_ort(models[1], earlier)) <= 1e-4
    assert all(len(m.cache) == 6 for m in memos)


def test_prefills_of_prompts_of_several_lengths_match_onnxruntime(pair: tuple[Path, Path]) -> None:
    """The prefill's mask and expand shapes come from groups that read other groups' values (its shape memo
    once answered a new prompt length with the first length's shapes)."""
    config = SIZES["tiny"]
    sess = epctx.InferenceSession(str(pair[0]), providers=["CPUExecutionProvider"])
    model = onnx.load(pair[0])
    for prompt in (7, 12, 3, 7, 20):
        feed = prefill_feeds(config, prompt)
        ours = sess.run(None, feed)
        assert ours[1].shape[2] == prompt
        assert _err(ours, run_ort(model, feed)) <= 1e-4


def test_the_plans_hold_the_chains_and_memos(pair: tuple[Path, Path]) -> None:
    """Each RMSNorm (2 per layer and the final one) and SiLU is one step, and no Shape node is left; in the
    decode model each rotate-half too (the prefill's slices it at a half read from the shapes: not a constant,
    left as nodes)."""
    config = SIZES["tiny"]
    for path in pair:
        sess = epctx.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        ops = [info[1] for info in sess._plan.info]
        norms = 2 * config.layers + 1
        assert ops.count("Pow") == norms and "ReduceMean" not in ops and "Sqrt" not in ops
        assert ops.count("Sigmoid") == config.layers and ops.count("Mul") < 8 * config.layers
        assert "Shape" not in ops and "ShapeMemo" in ops
        assert len(ops) < len(onnx.load(path).graph.node) / 2.5
    decode = [info[1] for info in epctx.InferenceSession(str(pair[1]))._plan.info]
    assert decode.count("Neg") == 0 and decode.count("Slice") == 2 * config.layers
