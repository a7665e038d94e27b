"""Shape arithmetic memoised per input-shape signature (session/plan_memo.py, issue 21): the steps that read only
tensor shapes (``Shape``, ``Size``) and constants run as one step that looks their values up by those shapes.
Checked against onnxruntime on models with dynamic dimensions whose shapes change between runs (new signatures,
old ones again, more signatures than the memo keeps), and on what must stay out of a memo."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import epctx
from epctx.errors import Fail
from epctx.session import plan as plan_module
from epctx.session import plan_memo
from tests.oracle import run_ort


def _const(name: str, values: Any, dtype: Any = np.int64) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(values, dtype), name)
    )


def _model(*, expose_shape: bool = False) -> onnx.ModelProto:
    """y = Reshape(x, [n, 4]) and a causal sum z = Trilu(ones(n, n)) @ y, x float [1, n, 4]: the target and
    the mask come from Shape(x) through Gather / Unsqueeze / Concat / ConstantOfShape (8 steps of shapes)."""
    nodes = [
        _const("one", 1),
        _const("zero", [0]),
        _const("four", [4]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "zero"], ["nu"]),
        helper.make_node("Concat", ["nu", "four"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
        helper.make_node("Concat", ["nu", "nu"], ["square"], axis=0),
        helper.make_node(
            "ConstantOfShape",
            ["square"],
            ["ones"],
            value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0]),
        ),
        helper.make_node("Trilu", ["ones"], ["lower"], upper=0),
        helper.make_node("MatMul", ["lower", "y"], ["z"]),
    ]
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("z", TensorProto.FLOAT, None),
    ]
    if expose_shape:
        outputs.append(helper.make_tensor_value_info("target", TensorProto.INT64, None))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n", 4])], outputs
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _session(model: onnx.ModelProto) -> epctx.InferenceSession:
    return epctx.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _memos(sess: epctx.InferenceSession) -> list[Any]:
    return [fn for fn, *_ in sess._plan.steps if isinstance(fn, plan_memo.ShapeMemo)]


def _check(sess: epctx.InferenceSession, model: onnx.ModelProto, n: int) -> None:
    x = np.random.default_rng(n).standard_normal((1, n, 4), dtype=np.float32)
    got, want = sess.run(None, {"x": x}), run_ort(model, {"x": x})
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_the_shape_steps_run_as_one_memoised_step() -> None:
    model = _model()
    sess = _session(model)
    (memo,) = _memos(sess)
    # Shape, Gather, Unsqueeze, the two Concats, ConstantOfShape and Trilu: one step; Reshape, MatMul stay
    assert [info[1] for info in sess._plan.info] == ["ShapeMemo", "Reshape", "MatMul"]
    _check(sess, model, 5)
    assert len(memo.cache) == 1


def test_shapes_that_change_between_runs_give_new_entries_and_old_ones_hit() -> None:
    """A growing dimension (a decode loop's past length): each run a new signature, each right; then a length
    seen before is looked up, not recomputed, and still right."""
    model = _model()
    sess = _session(model)
    (memo,) = _memos(sess)
    for n in range(1, 9):
        _check(sess, model, n)
    assert len(memo.cache) == 8
    calls = []
    inner = memo.run
    memo.run = lambda args: calls.append(1) or inner(args)
    _check(sess, model, 3)
    assert not calls  # a hit
    _check(sess, model, 40)
    assert calls == [1]


def test_the_memo_is_bounded_and_its_values_are_read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_memo, "MEMO_ENTRIES", 16)
    model = _model()
    sess = _session(model)
    (memo,) = _memos(sess)
    for n in range(1, plan_memo.MEMO_ENTRIES + 6):
        _check(sess, model, n)
    assert len(memo.cache) == plan_memo.MEMO_ENTRIES
    assert (1, 1, 4) not in memo.cache  # the oldest went first
    for values in memo.cache.values():
        assert all(not v.flags.writeable for v in values)
    _check(sess, model, 1)  # recomputed once dropped


def test_a_memo_larger_than_its_byte_bound_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model()
    sess = _session(model)
    (memo,) = _memos(sess)
    monkeypatch.setattr(plan_memo, "MEMO_BYTES", 64)  # an 8 x 8 float32 mask is 256 bytes
    _check(sess, model, 8)
    _check(sess, model, 2)
    assert list(memo.cache) == [(1, 2, 4)]


def test_a_shape_value_the_caller_sees_stays_out_of_the_memo_and_is_its_own_array() -> None:
    """``target`` is a graph output: its step is not memoised (the caller gets a fresh, writeable array each
    run); the mask's steps still are."""
    model = _model(expose_shape=True)
    sess = _session(model)
    assert len(_memos(sess)) == 1
    assert "Concat" in [info[1] for info in sess._plan.info]
    x = np.ones((1, 3, 4), np.float32)
    first = sess.run(None, {"x": x})[2]
    assert first.flags.writeable
    first[:] = 0
    np.testing.assert_array_equal(sess.run(None, {"x": x})[2], [3, 4])
    _check(sess, model, 6)


def test_without_constant_folding_nothing_is_memoised() -> None:
    so = epctx.SessionOptions()
    so.graph_optimization_level = epctx.GraphOptimizationLevel.ORT_DISABLE_ALL
    model = _model()
    sess = epctx.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    assert not _memos(sess)
    _check(sess, model, 4)


def test_an_error_inside_a_memo_names_the_node() -> None:
    """A Reshape of a shape value to an impossible target fails inside the memo's own plan: the message names
    that node, as the plain plan's would."""
    nodes = [
        _const("idx", [0, 1]),
        _const("bad", [5]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "idx"], ["two"], axis=0),
        helper.make_node("Reshape", ["two", "bad"], ["five"], name="impossible"),
        helper.make_node("Expand", ["x", "five"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = _session(model)
    assert _memos(sess)
    with pytest.raises(Fail, match="impossible"):
        sess.run(None, {"x": np.ones((2, 3), np.float32)})


def test_runs_on_several_threads_share_the_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads running one session with shapes that come and go: every result right, the memo bounded."""
    import threading

    monkeypatch.setattr(plan_memo, "MEMO_ENTRIES", 16)
    model = _model()
    sess = _session(model)
    (memo,) = _memos(sess)
    failures: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for k in range(40):
                _check(sess, model, 1 + (seed * 7 + k) % (plan_memo.MEMO_ENTRIES + 8))
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert len(memo.cache) <= plan_memo.MEMO_ENTRIES
    assert memo.bytes == sum(v.nbytes for values in memo.cache.values() for v in values)


def _two_sources_model() -> onnx.ModelProto:
    """y = ones(n, m) @ b for a [n, 4] and b [m, 4]: n and m each from their own Shape (a group each), the
    Concat and the ConstantOfShape of both (a group that reads no shape itself, only the other groups')."""
    nodes = [
        _const("zero", 0),
        _const("axes", [0]),
        helper.make_node("Shape", ["a"], ["sa"]),
        helper.make_node("Gather", ["sa", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["nu"]),
        helper.make_node("Shape", ["b"], ["sb"]),
        helper.make_node("Gather", ["sb", "zero"], ["m"], axis=0),
        helper.make_node("Unsqueeze", ["m", "axes"], ["mu"]),
        helper.make_node("Concat", ["nu", "mu"], ["nm"], axis=0),
        helper.make_node(
            "ConstantOfShape", ["nm"], ["ones"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])
        ),
        helper.make_node("MatMul", ["ones", "b"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 4]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["m", 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_group_that_reads_only_other_groups_is_keyed_by_all_their_sources() -> None:
    """The group of Concat and ConstantOfShape depends on the shapes of a and b through the other two groups:
    its key holds both, so a new n or a new m is a new entry (it once had no key at all, and answered the first
    entry for every shape)."""
    model = _two_sources_model()
    sess = _session(model)
    memos = _memos(sess)
    assert sorted(m.sources for m in memos) == [1, 1, 2]
    rng = np.random.default_rng(0)
    for n, m in [(2, 3), (5, 3), (5, 7), (2, 3), (1, 1)]:
        feed = {
            "a": rng.standard_normal((n, 4), dtype=np.float32),
            "b": rng.standard_normal((m, 4), dtype=np.float32),
        }
        (ours,), (theirs,) = sess.run(None, feed), run_ort(model, feed)
        assert ours.shape == theirs.shape == (n, 4)
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_a_loop_body_whose_state_grows_memoises_per_iteration_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Loop whose state grows by one row an iteration, its body reading the state's shape (Shape, Gather,
    Unsqueeze, Concat, ConstantOfShape: a group in the body's own plan): each iteration a new signature, every
    value as onnxruntime's, and a second run over the same lengths answered from the body's memo."""
    body = helper.make_graph(
        [
            _const("zero", 0),
            _const("axes", [0]),
            _const("one", [1]),
            helper.make_node("Shape", ["s_in"], ["sh"]),
            helper.make_node("Gather", ["sh", "zero"], ["rows"], axis=0),
            helper.make_node("Unsqueeze", ["rows", "axes"], ["rows1"]),
            helper.make_node("Concat", ["one", "rows1"], ["row_shape"], axis=0),
            helper.make_node(
                "ConstantOfShape",
                ["row_shape"],
                ["ones"],
                value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0]),
            ),
            helper.make_node("MatMul", ["ones", "s_in"], ["total"]),  # (1, rows) @ (rows, 3): the column sums
            helper.make_node("Concat", ["s_in", "total"], ["s_out"], axis=0),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [None, 3]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [None, 3]),
        ],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)],
        "g",
        [
            helper.make_tensor_value_info("n", TensorProto.INT64, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    made: list[plan_memo.ShapeMemo] = []

    class Counted(plan_memo.ShapeMemo):
        __slots__ = ()

        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(plan_module, "ShapeMemo", Counted)
    sess = _session(model)
    (memo,) = made  # the body's
    feed = {
        "n": np.array(6, np.int64),
        "x": np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32),
    }
    for _ in range(2):
        (ours,), (theirs,) = sess.run(None, feed), run_ort(model, feed)
        assert ours.shape == theirs.shape == (8, 3)
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-4)
        assert sorted(memo.cache) == [(rows, 3) for rows in range(2, 8)]
