"""run()'s fast paths around the plan (issue 21): the feed check over precomputed per-input tuples, and the
results handed over without a copy when they are fresh arrays. A wrong feed takes the full check and is refused
with the same message; a result that would alias an input, a constant or a read-only array is still copied."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

import epctx
from epctx.errors import EPCtxError, InvalidArgument
from epctx.session.feeds import FeedBinder, InputSpec
from epctx.session.ortvalue import OrtValue, owned_array, owned_arrays

_SPECS = [
    InputSpec("ids", "tensor(int64)", np.dtype(np.int64), [1, "seq"]),
    InputSpec("past", "tensor(float)", np.dtype(np.float32), [1, 2, "past", 4]),
    InputSpec("scale", "tensor(float)", np.dtype(np.float32), []),
]
_GOOD = {
    "ids": np.zeros((1, 3), np.int64),
    "past": np.zeros((1, 2, 5, 4), np.float32),
    "scale": np.array(1.0, np.float32),
}


def _outcome(call: Any) -> tuple[type, str] | list[Any]:
    try:
        return call()
    except EPCtxError as exc:
        return type(exc), str(exc)


@pytest.mark.parametrize(
    "change",
    [
        {},  # good, in order
        {"order": True},  # good, another order
        {"ids": np.zeros((1, 3), np.int32)},  # dtype
        {"past": np.zeros((1, 2, 5), np.float32)},  # rank
        {"past": np.zeros((1, 3, 5, 4), np.float32)},  # a static size
        {"past": np.zeros((2, 3, 5, 5), np.float32)},  # several static sizes
        {"scale": 1.5},  # a Python scalar: converted by the full check
        {"ids": [[1, 2, 3]]},  # a list: converted
        {"ids": OrtValue(np.zeros((1, 3), np.int64))},  # an OrtValue: its array
        {"ids": "text"},  # not an array
        {"drop": "scale", "extra": np.zeros(1)},  # as many names, one unknown
        {"drop": "scale"},  # missing
        {"extra": np.zeros(1)},  # one too many
        {"ids": np.zeros((1, 3), np.int64).view(np.ndarray).astype(">i8")},  # non-native byte order
    ],
)
def test_the_fast_check_binds_or_refuses_as_the_full_check(change: dict[str, Any]) -> None:
    feed = dict(_GOOD)
    if change.get("order"):
        feed = dict(reversed(list(feed.items())))
    for name, value in change.items():
        if name == "drop":
            del feed[value]
        elif name != "order":
            feed[name] = value
    binder = FeedBinder(_SPECS)
    fast, full = _outcome(lambda: binder.bind(feed)), _outcome(lambda: binder._bind(feed))
    if isinstance(full, tuple):
        assert fast == full
    else:
        assert isinstance(fast, list) and len(fast) == len(full) == 3
        for a, b in zip(fast, full):
            np.testing.assert_array_equal(a, b)
            assert a.dtype == b.dtype


def test_a_fed_array_is_bound_as_it_is() -> None:
    bound = FeedBinder(_SPECS).bind(_GOOD)
    assert all(b is _GOOD[s.name] for b, s in zip(bound, _SPECS))


def test_inputs_without_a_known_rank_or_type_take_the_full_check() -> None:
    specs = [*_SPECS, InputSpec("seq", "seq(tensor(float))", None, None)]
    binder = FeedBinder(specs)
    assert binder._checks is None
    bound = binder.bind({**_GOOD, "seq": [np.zeros(2)]})
    assert bound[3][0].shape == (2,)
    assert FeedBinder(_SPECS)._checks is not None


def _model() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["y"], name="add")],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.mark.parametrize(
    "feed",
    [
        {"x": np.zeros((1, 4), np.float32), "b": np.zeros(3, np.float32)},
        {"x": np.zeros((1, 3), np.float64), "b": np.zeros(3, np.float32)},
        {"x": np.zeros((3,), np.float32), "b": np.zeros(3, np.float32)},
        {"x": np.zeros((1, 3), np.float32), "c": np.zeros(3, np.float32)},
        {"x": np.zeros((1, 3), np.float32)},
    ],
)
def test_a_wrong_feed_is_refused_with_onnxruntimes_words(feed: dict[str, Any]) -> None:
    ort = pytest.importorskip("onnxruntime")
    sess = epctx.InferenceSession(_model(), providers=["CPUExecutionProvider"])
    with pytest.raises(InvalidArgument) as ours:
        sess.run(None, feed)
    with pytest.raises(Exception) as theirs:
        ort.InferenceSession(_model(), providers=["CPUExecutionProvider"]).run(None, feed)
    text, mine = str(theirs.value), str(ours.value)
    words = {
        "Got invalid dimensions for input: x": "Got invalid dimensions for input: x",
        "Invalid rank for input: x": "Invalid rank for input: x",
        "Unexpected input data type": "Unexpected input data type",
        "Invalid input name": "invalid input name",
        "Required inputs": "missing input",
    }
    matched = [ours_words for theirs_words, ours_words in words.items() if theirs_words in text]
    assert matched, text
    assert all(w in mine for w in matched), (mine, text)


def test_fresh_results_are_handed_over_and_the_others_copied() -> None:
    fresh = np.arange(3.0)
    base = np.arange(6.0)
    view = base[:3]
    frozen = np.arange(3.0)
    frozen.flags.writeable = False

    class Sub(np.ndarray):
        pass

    sub = np.arange(3.0).view(Sub)
    values = [fresh, view, frozen, sub, None, [1, 2], np.float32(2.0)]
    got = owned_arrays(values)
    want = [owned_array(v) for v in values]
    assert got[0] is fresh
    assert got[1] is not view and not np.shares_memory(got[1], base)
    assert got[2] is not frozen and got[2].flags.writeable
    assert got[3] is not sub  # a view of the array it was made from: copied
    assert got[4] is None and got[5] == [1, 2]
    assert isinstance(got[6], np.ndarray) and got[6] == 2.0
    for a, b in zip(got[:4], want[:4]):
        np.testing.assert_array_equal(a, b)
        assert type(a) is type(b)


def test_a_one_step_session_never_returns_its_inputs_or_constants() -> None:
    """Identity of a graph input and of an initializer: a one-step plan (the direct call) returns arrays of
    their own, as onnxruntime."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Identity", ["w"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [2]),
        ],
        initializer=[helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    sess = epctx.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.array([3.0, 4.0], np.float32)
    y, z = sess.run(None, {"x": x})
    _, z2 = sess.run(None, {"x": x})
    assert not np.shares_memory(y, x) and not np.shares_memory(z, z2)
    z[0] = 99.0
    np.testing.assert_array_equal(sess.run(None, {"x": x})[1], [1.0, 2.0])


def test_concurrent_runs_of_one_session_each_get_their_own_results() -> None:
    """Threads share the session (its plan, binder and direct call) and never each other's values."""
    from concurrent.futures import ThreadPoolExecutor

    sess = epctx.InferenceSession(_model(), providers=["CPUExecutionProvider"])
    assert sess._plan._direct is not None
    b = np.ones(3, np.float32)

    def work(k: int) -> bool:
        for j in range(200):
            x = np.full((1, 3), k * 1000 + j, np.float32)
            (y,) = sess.run(None, {"x": x, "b": b})
            if not np.array_equal(y, x + 1):
                return False
        return True

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(work, range(8)))
