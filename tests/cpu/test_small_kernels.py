"""The small kernels the LLM pair runs hundreds of times (issue 21): Expand's own broadcast of shapes (against
numpy's and onnxruntime's) and its cache of result shapes, ConstantOfShape, the MatMul products OpenBLAS runs
on one thread by itself (no thread-count calls around them), and the one-thread run scope."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from epctx.errors import Fail
from epctx.providers.cpu import blas_serial
from tests.oracle import run_ort


def _expand_model() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Expand", ["x", "shape"], ["y"], name="expand")],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("shape", TensorProto.INT64, None),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


@pytest.mark.parametrize(
    ("x_shape", "target"),
    [
        ((1, 2, 1, 17, 16), (1, 2, 2, 17, 16)),  # GQA's K / V repeated per query head
        ((3, 1), (2, 1, 4)),  # a longer target
        ((2, 3, 4), (3, 1)),  # a shorter one, and a 1 that keeps x's size
        ((1,), ()),
        ((), (2, 2)),
    ],
)
def test_expand_broadcasts_as_numpy_and_onnxruntime(
    x_shape: tuple[int, ...], target: tuple[int, ...]
) -> None:
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    feed = {"x": x, "shape": np.array(target, np.int64)}
    (ours,) = epctx.InferenceSession(_expand_model()).run(None, feed)
    (theirs,) = run_ort(_expand_model(), feed)
    assert ours.shape == theirs.shape == np.broadcast_shapes(x_shape, target)
    np.testing.assert_array_equal(ours, theirs)
    assert ours.flags.writeable and not np.shares_memory(ours, x)


def test_expand_to_an_incompatible_shape_fails_naming_the_node() -> None:
    feed = {"x": np.ones((2, 3), np.float32), "shape": np.array([4, 3], np.int64)}
    with pytest.raises(Fail, match="expand.*cannot be broadcast"):
        epctx.InferenceSession(_expand_model()).run(None, feed)


def test_products_openblas_runs_on_one_thread_skip_the_thread_count_calls() -> None:
    one = blas_serial.single_threaded
    assert one(np.empty((1, 1, 64)), 64)  # a decode step's projection (GEMV-sized)
    assert one(np.empty((1, 16, 64)), 64)  # a prefill's: 65536 multiply-adds of a GEMM
    assert not one(np.empty((1, 1, 512)), 512)  # a GEMV OpenBLAS may split (262144 > 9216)
    assert not one(np.empty((1, 64, 64)), 64)  # 2^18: OpenBLAS's GEMM threshold
    assert not one(np.empty((4, 1, 128)), 128)  # one row per product: GEMVs of 16384


def test_expand_reads_the_shape_each_run_whatever_it_saw_before() -> None:
    """Expand keeps the result shapes it worked out, keyed by the shape's values: the same array changed in
    place between runs, or another target for the same input, gives the new shape."""
    sess = epctx.InferenceSession(_expand_model())
    x = np.arange(3, dtype=np.float32).reshape(3, 1)
    shape = np.array([3, 2], np.int64)
    assert sess.run(None, {"x": x, "shape": shape})[0].shape == (3, 2)
    shape[1] = 5
    assert sess.run(None, {"x": x, "shape": shape})[0].shape == (3, 5)
    assert sess.run(None, {"x": x, "shape": np.array([2, 3, 4], np.int64)})[0].shape == (2, 3, 4)
    assert sess.run(None, {"x": x[:1], "shape": shape})[0].shape == (3, 5)


def test_a_projection_by_a_constant_weight_gives_what_numpy_gives() -> None:
    """MatMul by a constant 2-D weight: small left sides go straight to numpy, larger ones through the sized
    path; both as onnxruntime (float32 and float64), 1-D and batched left sides."""
    w = np.random.default_rng(1).standard_normal((64, 160))
    for dtype, tensor_type in ((np.float32, TensorProto.FLOAT), (np.float64, TensorProto.DOUBLE)):
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["a", "w"], ["y"])],
            "g",
            [helper.make_tensor_value_info("a", tensor_type, None)],
            [helper.make_tensor_value_info("y", tensor_type, None)],
            [numpy_helper.from_array(w.astype(dtype), "w")],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
        sess = epctx.InferenceSession(model)
        assert blas_serial.single_threaded_rows(w.astype(dtype)) == 58
        for shape in ((64,), (1, 1, 64), (1, 16, 64), (3, 40, 64)):
            a = np.random.default_rng(2).standard_normal(shape).astype(dtype)
            (ours,), (theirs,) = sess.run(None, {"a": a}), run_ort(model, {"a": a})
            assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-4)
    assert blas_serial.single_threaded_rows(np.ones((4, 4, 4), np.float32)) == 0
    assert blas_serial.single_threaded_rows(np.ones((4, 4), np.int64)) == 0


def _numpy_blas_threads() -> int:
    import threadpoolctl

    found = [
        i for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas" and "numpy" in i["filepath"]
    ]
    return int(found[0]["num_threads"]) if found else -1


def test_one_thread_runs_hold_numpy_blas_at_one_thread_and_restore_it() -> None:
    """``intra_op_num_threads=1``: the CPU EP's run scope sets numpy's OpenBLAS through its own two calls (not
    threadpoolctl's limit, 9 us a run) and restores the count it found."""
    import threadpoolctl

    from epctx.providers.cpu.provider import CPUExecutionProvider

    scope = blas_serial.one_thread()
    if scope is None:
        pytest.skip("numpy's BLAS is no pthreads OpenBLAS")
    assert type(CPUExecutionProvider({"intra_op_num_threads": "1"}).run_scope()) is type(scope)
    assert type(CPUExecutionProvider({"intra_op_num_threads": "2"}).run_scope()) is not type(scope)
    assert CPUExecutionProvider().run_scope() is None
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        before = _numpy_blas_threads()
        with scope:
            assert _numpy_blas_threads() == 1
        assert _numpy_blas_threads() == before == 2


def test_a_small_projection_by_a_constant_weight_skips_the_sized_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The weight as the loader gives it (its dtype object not numpy's canonical one): a one-row left side
    goes straight to numpy's matmul."""
    from epctx.providers.cpu.kernels import linalg

    w = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    sess = epctx.InferenceSession(model)
    sized: list[tuple[int, ...]] = []
    product = linalg._product
    monkeypatch.setattr(linalg, "_product", lambda a, b: sized.append(a.shape) or product(a, b))
    a = np.ones((1, 1, 64), np.float32)
    np.testing.assert_allclose(sess.run(None, {"a": a})[0], a @ w, rtol=1e-5)
    sess.run(None, {"a": np.ones((1, 40, 64), np.float32)})
    assert sized == [(1, 40, 64)]


@pytest.mark.parametrize(
    ("shape", "value"),
    [
        ([2, 3], None),  # float32 zeros
        ([4], helper.make_tensor("v", TensorProto.INT64, [1], [7])),
        ([0, 5], helper.make_tensor("v", TensorProto.FLOAT, [1], [1.5])),
        ([], helper.make_tensor("v", TensorProto.BOOL, [1], [True])),  # an empty shape: a scalar
    ],
)
def test_constant_of_shape_fills_as_onnxruntime(shape: list[int], value: Any) -> None:
    attrs = {} if value is None else {"value": value}
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["y"], **attrs)],
        "g",
        [helper.make_tensor_value_info("shape", TensorProto.INT64, [len(shape)])],
        [
            helper.make_tensor_value_info(
                "y", value.data_type if value is not None else TensorProto.FLOAT, None
            )
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()
    feed = {"shape": np.array(shape, np.int64)}
    (ours,), (theirs,) = epctx.InferenceSession(model).run(None, feed), run_ort(model, feed)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs)


def test_softmax_rows_with_nan_inf_and_masks_as_onnxruntime() -> None:
    """The shift by fmax's maximum (NaN-ignoring): a row with a NaN, with +inf, all -inf, or all equal comes
    out as onnxruntime's."""
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    x = np.random.default_rng(3).standard_normal((6, 5)).astype(np.float32)
    x[1, 2] = np.nan
    x[2, 0] = np.inf
    x[3] = -np.inf
    x[4] = 7.0
    x[5, 1:] = -np.inf
    (ours,), (theirs,) = epctx.InferenceSession(model).run(None, {"x": x}), run_ort(model, {"x": x})
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7, equal_nan=True)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))


def test_a_slice_by_runtime_inputs_reads_them_each_run() -> None:
    """Slice's starts / ends / axes / steps fed at run time: the key it keeps per values follows new values,
    the same array changed in place, another integer type and another rank, as onnxruntime slices."""
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
            *(
                helper.make_tensor_value_info(n, TensorProto.INT64, [None])
                for n in ("starts", "ends", "axes", "steps")
            ),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    sess = epctx.InferenceSession(model)
    x3 = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    starts = np.array([1], np.int64)
    cases = [
        (x3, starts, [5], [-1], [1]),
        (x3, starts, [5], [-1], [1]),  # starts changed in place below, before this runs
        (x3, [0, 3], [2, -5], [0, 1], [1, -1]),
        (x3.reshape(12, 5), [-1], [-100], [0], [-2]),
    ]
    for k, (x, s, e, a, st) in enumerate(cases):
        if k == 1:
            starts[0] = 3
        feed = {"x": x, "starts": np.asarray(s, np.int64), "ends": np.asarray(e, np.int64)}
        feed.update(axes=np.asarray(a, np.int64), steps=np.asarray(st, np.int64))
        (ours,), (theirs,) = sess.run(None, feed), run_ort(model, feed)
        np.testing.assert_array_equal(ours, theirs)
