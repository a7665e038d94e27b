"""The measured rule's further sizes (``epctx.partition.synthetic.FURTHER_DIMS``): a partition that runs at neither
128 nor 32 (a model that runs at one height only, as PP-OCRv4's recogniser needs 48) is tried at further sizes in
turn and measured at the first at which both sides run; the hand-back reason names it; the tries are capped.
The slow test EP of tests/test_partition_measured_rule.py stands for a slow backend (it runs the nodes with CPU
kernels, so it fails where the CPU EP fails); the last test runs the real ppocr_rec on IREE."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from epctx.partition.synthetic import FURTHER_DIMS, OTHER_DIM, SMALL_DIM, chosen_sizes, further_choices
from tests.oracle import run_ort
from tests.requires import requires
from tests.test_partition_measured_rule import RULE, _session, _spy_shapes, _value

# the kernel EP's side 2 ms slower: a test EP that runs the same kernels is "not slower" whatever the load
pytestmark = pytest.mark.usefixtures("kernel_ep_delayed")

EP = "MeasuredRuleTestExecutionProvider"
CPU = "CPUExecutionProvider"


def _one_height(height: int) -> bytes:
    """x [batch, 2, ?, w] -> AveragePool (kernel height ``height``) -> Squeeze(axis 2) -> Relu -> y [batch, 2, w']:
    runs only when the anonymous height is ``height`` (below it the pool's kernel does not fit; above it the
    pooled height is over 1 and the Squeeze refuses it), as PP-OCR's recogniser collapses its height of 48."""
    axes = numpy_helper.from_array(np.array([2], np.int64), "axes")
    nodes = [
        helper.make_node("AveragePool", ["x"], ["p"], name="pool", kernel_shape=[height, 2], strides=[1, 2]),
        helper.make_node("Squeeze", ["p", "axes"], ["s"], name="squeeze"),
        helper.make_node("Relu", ["s"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "one_height",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, "?", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, None])],
        [axes],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _check(sess: epctx.InferenceSession, model: bytes, height: int) -> None:
    x = np.random.default_rng(1).random((2, 2, height, 10)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], run_ort(model, {"x": x})[0], rtol=1e-6)


def test_a_partition_that_runs_at_one_height_only_is_measured_there_and_handed_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shapes = _spy_shapes(monkeypatch)
    model = _one_height(48)
    sess = _session(model, **{RULE: "1"})
    assert shapes == [[(1, 2, OTHER_DIM, OTHER_DIM)], [(1, 2, SMALL_DIM, SMALL_DIM)], [(1, 2, 48, 48)]]
    assert {ep for ep, _ in sess.get_partitions()} == {CPU}
    why = sess.get_fallback_reasons()["pool"][EP]
    assert why.startswith(f"measured: {EP} ") and "synthetic inputs, batch=1, x[2]=48, w=48;" in why, why
    assert "=128" not in why and "=32" not in why, why
    _check(sess, model, 48)


def test_the_further_sizes_are_tried_in_turn_until_one_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Height 96: 48 and 64 fail on the EP's side (one run each), 96 runs and is measured; a fast EP keeps it."""
    shapes = _spy_shapes(monkeypatch)
    model = _one_height(96)
    sess = _session(model, from_size=10**9, **{RULE: "1"})  # never slow: kept
    assert [s[0][2] for s in shapes] == [OTHER_DIM, SMALL_DIM, 48, 64, 96]
    assert sess.get_partitions() == [(EP, ["pool", "squeeze", "relu"])]
    assert sess.get_fallback_reasons() == {}
    _check(sess, model, 96)


def test_the_tries_are_capped_and_a_partition_that_never_runs_is_kept(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A height no size of the list reaches (1000): every further size tried once, then not measured: kept."""
    shapes = _spy_shapes(monkeypatch)
    caplog.set_level("INFO", logger="epctx")
    sess = _session(_one_height(1000), **{RULE: "1"})
    assert [s[0][2] for s in shapes] == [OTHER_DIM, SMALL_DIM, *FURTHER_DIMS]
    assert sess.get_partitions() == [(EP, ["pool", "squeeze", "relu"])]
    assert sess.get_fallback_reasons() == {}
    logged = caplog.text
    assert "trying further sizes: batch=1, x[2]=48, w=48; batch=1, x[2]=64, w=64;" in logged, logged
    assert "runs at none of the further sizes" in logged


def test_further_choices_skip_batches_and_sizes_tried() -> None:
    import onnx_ir as ir

    image = _value("x", ["batch", 3, "?", "width"], ir.DataType.FLOAT)
    tried = [chosen_sizes([image], OTHER_DIM), chosen_sizes([image], SMALL_DIM)]
    found = further_choices([image], [t for t in tried if t is not None])
    assert [f["x[2]"] for f in found] == list(FURTHER_DIMS)
    assert all(f["batch"] == 1 and f["width"] == f["x[2]"] for f in found)
    assert (
        further_choices([image], [{"batch": 1, "x[2]": 48, "width": 48}])[0]["x[2]"] == 64
    )  # tried: left out
    assert (
        further_choices([_value("b", ["batch", 4], ir.DataType.FLOAT)]) == []
    )  # a batch only: nothing to try
    assert further_choices([ir.Value(name="u", type=ir.TensorType(ir.DataType.FLOAT))]) == []  # rank unknown


def test_a_dimension_named_by_a_number_is_that_size() -> None:
    """The model's own hint: a dimension named ``"48"`` is 48 at every choice (never 128 or 32)."""
    import onnx_ir as ir

    image = _value("x", ["batch", 3, "48", "width"], ir.DataType.FLOAT)
    assert chosen_sizes([image], OTHER_DIM) == {"batch": 1, "48": 48, "width": OTHER_DIM}
    assert chosen_sizes([image], SMALL_DIM) == {"batch": 1, "48": 48, "width": SMALL_DIM}
    assert {f["48"] for f in further_choices([image])} == {48}


def test_a_height_hint_in_the_model_is_measured_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model of the first test with its height named "48": measured at 48 from the first choice."""
    import onnx

    shapes = _spy_shapes(monkeypatch)
    proto = onnx.load_from_string(_one_height(48))
    proto.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "48"
    sess = _session(proto.SerializeToString(), **{RULE: "1"})
    assert shapes == [[(1, 2, 48, OTHER_DIM)], [(1, 2, 48, SMALL_DIM)]]
    why = sess.get_fallback_reasons()["pool"][EP]
    assert "batch=1, 48=48, w=128;" in why and "batch=1, 48=48, w=32;" in why, why


@pytest.mark.slow
@requires("iree.runtime", "iree.compiler", "rapidocr_onnxruntime")
def test_ppocr_rec_on_iree_is_measured_at_48_and_handed_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The corpus's PP-OCRv4 recogniser (height '?' must be 48): IREE's dynamic-shape code was kept unmeasured
    and ran 7x slower than the CPU EP; measured at 48 now, it is handed back. (By default IREE is not given a
    model whose convolutions have dynamic spatial sizes at all: EPCTX_IREE_DYNAMIC_CONVS=1 gives it.)"""
    from benchmarks.corpus import Unavailable, feeds, materialise

    monkeypatch.setenv("EPCTX_IREE_DYNAMIC_CONVS", "1")

    try:
        path = materialise("ppocr_rec", tmp_path)
    except Unavailable as exc:
        pytest.skip(str(exc))
    caplog.set_level("INFO", logger="epctx")
    so = epctx.SessionOptions()
    so.intra_op_num_threads = 1
    so.add_session_config_entry(RULE, "1")
    sess = epctx.InferenceSession(str(path), so, providers=["IREEExecutionProvider", CPU])
    reasons: dict[str, Any] = sess.get_fallback_reasons()
    measured = [why for per_ep in reasons.values() for why in per_ep.values() if why.startswith("measured: ")]
    assert measured, caplog.text
    assert "x[2]=48" in measured[0], measured[0]
    assert {ep for ep, _ in sess.get_partitions()} == {CPU}, sess.get_partitions()
    feed = feeds("ppocr_rec")
    got = sess.run(None, feed)[0]
    np.testing.assert_allclose(got, run_ort(path.read_bytes(), feed)[0], atol=1e-3)
