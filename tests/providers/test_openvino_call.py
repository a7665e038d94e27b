"""OpenVINO's per-call path (providers/openvino/compiled.py, request.py): small inputs copied into buffers the
request keeps, large ones shared, outputs handed over as arrays no later call overwrites; every case against
numpy or onnxruntime."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

pytest.importorskip("openvino")

import epctx
from epctx.providers.openvino.compiled import CompiledOpenVINO
from epctx.providers.openvino.request import COPY_LIMIT
from tests.oracle import run_ort

EP = "OpenVINOExecutionProvider"
F = TensorProto.FLOAT


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _session(model: onnx.ModelProto) -> epctx.InferenceSession:
    sess = epctx.InferenceSession(model.SerializeToString(), providers=[EP])
    assert {ep for ep, _ in sess.get_partitions()} == {EP}
    return sess


def _scale_model(dims: list[Any]) -> onnx.ModelProto:
    """y = 2x + 1 and z = -x: two outputs of one input of shape ``dims``."""
    two = helper.make_node("Constant", [], ["two"], value=helper.make_tensor("two", F, [], [2.0]))
    one = helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", F, [], [1.0]))
    nodes = [
        two,
        one,
        helper.make_node("Mul", ["x", "two"], ["t"]),
        helper.make_node("Add", ["t", "one"], ["y"]),
        helper.make_node("Neg", ["x"], ["z"]),
    ]
    io = [helper.make_tensor_value_info("x", F, dims)]
    return _model(nodes, io, [helper.make_tensor_value_info(n, F, dims) for n in ("y", "z")])


def _compiled(model: onnx.ModelProto, inputs: list[str], outputs: list[str]) -> CompiledOpenVINO:
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(core.read_model(model.SerializeToString()), "CPU")
    return CompiledOpenVINO(compiled, inputs, outputs, where="test")


def test_results_of_successive_runs_stay_distinct() -> None:
    sess = _session(_scale_model([2, 3]))
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    first = sess.run(None, {"x": a})
    kept = [r.copy() for r in first]
    second = sess.run(None, {"x": a + 10})
    for r, k in zip(first, kept):
        np.testing.assert_array_equal(r, k)  # the second run wrote somewhere else
    np.testing.assert_array_equal(second[0], 2 * (a + 10) + 1)
    assert not any(np.shares_memory(r, s) for r in first for s in second)
    assert not np.shares_memory(first[0], first[1])


def test_an_input_changed_in_place_is_read_again() -> None:
    """The small input is copied into the request's buffer at every call: the array's new values count."""
    sess = _session(_scale_model([2, 3]))
    a = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": a})[0], np.full((2, 3), 3, np.float32))
    a[1, 2] = 5
    expected = 2 * a + 1
    np.testing.assert_array_equal(sess.run(None, {"x": a})[0], expected)
    np.testing.assert_array_equal(sess.run(None, {"x": a.copy()})[0], expected)  # another array, same shape


@pytest.mark.parametrize("rows", [2, COPY_LIMIT // 12 + 5])  # copied into the buffer / shared with OpenVINO
def test_dynamic_shapes_alternate(rows: int) -> None:
    sess = _session(_scale_model(["N", 3]))
    rng = np.random.default_rng(0)
    for n in (rows, rows + 1, rows, 0, rows + 1, rows):
        x = rng.standard_normal((n, 3)).astype(np.float32)
        y, z = sess.run(None, {"x": x})
        np.testing.assert_allclose(y, 2 * x + 1, rtol=1e-6)
        np.testing.assert_array_equal(z, -x)
        assert y.shape == (n, 3)


def test_small_and_large_inputs_on_one_port() -> None:
    """A port bound to our buffer, then to a shared (large) array, then to a buffer again."""
    sess = _session(_scale_model(["N", 3]))
    big = COPY_LIMIT // 12 + 100
    rng = np.random.default_rng(1)
    for n in (4, big, 4, 4, big, big, 7):
        x = rng.standard_normal((n, 3)).astype(np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[1], -x)


@pytest.mark.parametrize("rows", [4, COPY_LIMIT // 12 + 5])
def test_read_only_and_non_contiguous_inputs(rows: int) -> None:
    sess = _session(_scale_model(["N", 3]))
    base = np.arange(rows * 6, dtype=np.float32).reshape(rows, 6)
    strided = base[:, ::2]  # non-contiguous
    frozen = base[:, :3].copy()
    frozen.flags.writeable = False
    for x in (strided, frozen, strided):
        np.testing.assert_array_equal(sess.run(None, {"x": x})[1], -x)


def test_scalars_bool_int64_float16_and_empty() -> None:
    """Rank-0 in and out, bool, int64 and float16 values, a zero-size tensor; against onnxruntime."""
    nodes = [
        helper.make_node("Mul", ["s", "s"], ["s2"]),
        helper.make_node("Not", ["b"], ["nb"]),
        helper.make_node("Add", ["i", "i"], ["i2"]),
        helper.make_node("Add", ["h", "h"], ["h2"]),
        helper.make_node("Neg", ["e"], ["ne"]),
    ]
    io = [
        ("s", F, []),
        ("b", TensorProto.BOOL, [3]),
        ("i", TensorProto.INT64, [2]),
        ("h", TensorProto.FLOAT16, [2]),
        ("e", F, ["M", 2]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info(n, t, d) for n, t, d in io],
        [helper.make_tensor_value_info(o, t, d) for o, (_, t, d) in zip(["s2", "nb", "i2", "h2", "ne"], io)],
    )
    sess = _session(model)
    for k in range(3):  # the first call binds, the next ones copy into the bound buffers
        feed = {
            "s": np.array(3.0 + k, np.float32),
            "b": np.array([True, False, k % 2 == 0]),
            "i": np.array([2**29 + k, -7], np.int64),  # OpenVINO CPU adds int64 in 32 bits
            "h": np.array([1.5, -2.25 * k], np.float16),
            "e": np.zeros((0, 2), np.float32) if k != 1 else np.ones((1, 2), np.float32),
        }
        ours, theirs = sess.run(None, feed), run_ort(model, feed)
        for a, b in zip(ours, theirs):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)


def test_a_wrong_dtype_fails_with_openvinos_message() -> None:
    """A bound buffer's dtype is never cast to: an array of another dtype is bound as it is, which OpenVINO
    refuses."""
    fn = _compiled(_scale_model([2, 3]), ["x"], ["y", "z"])
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(fn(x)[0], 2 * x + 1)
    with pytest.raises(RuntimeError, match="(?i)type|precision"):
        fn(x.astype(np.float64))
    np.testing.assert_array_equal(fn(x)[1], -x)  # the request still works


def test_outputs_in_another_order_and_the_same_value_twice() -> None:
    """Partition outputs picked out of the compiled model's order, one port read as two outputs."""
    fn = _compiled(_scale_model([2, 3]), ["x"], ["z", "y"])
    x = np.full((2, 3), 2, np.float32)
    z, y = fn(x)
    np.testing.assert_array_equal(z, -x)
    np.testing.assert_array_equal(y, 2 * x + 1)
    model = _model(
        [helper.make_node("Relu", ["x"], ["r"])],
        [helper.make_tensor_value_info("x", F, [3])],
        [helper.make_tensor_value_info("r", F, [3])],
    )
    fn = _compiled(model, ["x"], ["r", "r"])
    a, b = fn(np.array([-1, 0, 2], np.float32))
    assert not np.shares_memory(a, b)
    np.testing.assert_array_equal(a, b)


def test_threads_with_shapes_of_their_own() -> None:
    """Each thread's request has its own buffers: threads feeding different shapes never see each other's."""
    sess = _session(_scale_model(["N", 3]))
    errors: list[BaseException] = []

    def work(k: int) -> None:
        rng = np.random.default_rng(k)
        try:
            for step in range(60):
                x = rng.standard_normal((1 + (k + step) % 3, 3)).astype(np.float32)
                np.testing.assert_allclose(sess.run(None, {"x": x})[0], 2 * x + 1, rtol=1e-6)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_large_inputs_are_shared_small_ones_copied() -> None:
    """Above COPY_LIMIT OpenVINO reads the caller's array in place (kept alive until the port is bound again);
    below it, a buffer of the request's own."""
    import weakref

    fn = _compiled(_scale_model(["N", 3]), ["x"], ["y", "z"])
    big = np.ones((COPY_LIMIT // 12 + 5, 3), np.float32)
    np.testing.assert_array_equal(fn(big)[1], -big)
    request = fn._local.state.request
    assert np.shares_memory(request.get_input_tensor(0).data, big)
    alive = weakref.ref(big)
    del big
    assert alive() is not None  # OpenVINO's tensor points into it: held by the request's state
    small = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(fn(small)[1], -small)
    assert alive() is None  # released once the port reads our buffer
    assert not np.shares_memory(request.get_input_tensor(0).data, small)


def test_a_failing_infer_is_fail_with_openvinos_message_and_the_next_run_works() -> None:
    """A shape OpenVINO refuses at run time (Reshape to another element count): epctx's Fail, in onnxruntime's
    words, carrying OpenVINO's message; the thread's request and buffers stay usable."""
    model = _model(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        [
            helper.make_tensor_value_info("x", F, ["N"]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", F, None)],
    )
    sess = _session(model)
    x = np.arange(6, dtype=np.float32)
    assert sess.run(None, {"x": x, "s": np.array([2, 3])})[0].shape == (2, 3)
    with pytest.raises(epctx.Fail, match=r"(?s)Non-zero status code.*Reshape"):
        sess.run(None, {"x": x, "s": np.array([4, 4])})
    np.testing.assert_array_equal(sess.run(None, {"x": x, "s": np.array([3, 2])})[0], x.reshape(3, 2))
