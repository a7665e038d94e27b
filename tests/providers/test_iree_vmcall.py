"""The IREE EP's call path (``providers/iree/vmcall.py``): IREE's VM called directly with numpy arrays, no
``FunctionInvoker`` (issue 21). Real modules compiled by IREE for this CPU: rank-0 values in and out, bool,
int64, float16 and zero-size tensors, one function called with other shapes call after call, calls from
several threads at once, and IREE's failures as EPFail with IREE's own message."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from epctx.errors import EPFail
from tests.requires import requires

pytestmark = [pytest.mark.slow, requires("iree.runtime", "iree.compiler")]

_TYPES = """
func.func @f(%a: tensor<i64>, %b: tensor<3xi1>, %c: tensor<3xf16>, %d: tensor<0x4xf32>, %e: tensor<f32>)
    -> (tensor<i64>, tensor<3xi1>, tensor<3xf16>, tensor<0x4xf32>, tensor<f32>) {
  %0 = arith.addi %a, %a : tensor<i64>
  %1 = arith.xori %b, %b : tensor<3xi1>
  %2 = arith.addf %c, %c : tensor<3xf16>
  %3 = arith.addf %d, %d : tensor<0x4xf32>
  %4 = arith.mulf %e, %e : tensor<f32>
  return %0, %1, %2, %3, %4 : tensor<i64>, tensor<3xi1>, tensor<3xf16>, tensor<0x4xf32>, tensor<f32>
}"""

# A dynamic leading dimension: one compiled function, any number of rows (the result's shape follows the input)
_DYNAMIC = """
func.func @f(%a: tensor<?x4xf32>, %b: tensor<?x4xi64>) -> (tensor<?x4xf32>, tensor<?x4xi64>) {
  %0 = arith.addf %a, %a : tensor<?x4xf32>
  %1 = arith.muli %b, %b : tensor<?x4xi64>
  return %0, %1 : tensor<?x4xf32>, tensor<?x4xi64>
}"""

# Results IREE hands back as the argument's own buffer (returned as is, and reshaped)
_PASSTHROUGH = """
func.func @f(%a: tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<16xf32>) {
  %0 = tensor.collapse_shape %a [[0, 1]] : tensor<4x4xf32> into tensor<16xf32>
  return %a, %0 : tensor<4x4xf32>, tensor<16xf32>
}"""

_PRIMITIVE = """
func.func @f(%a: tensor<2xf32>) -> i64 {
  %c = arith.constant 7 : i64
  return %c : i64
}"""


def _call(source: str, threads: int = 1) -> Any:
    import iree.compiler as ic
    import iree.runtime as rt

    from epctx.providers.iree.runtime import shared_runtime
    from epctx.providers.iree.vmcall import VmCall

    vmfb = ic.compile_str(source, target_backends=["llvm-cpu"], extra_args=["--iree-llvmcpu-target-cpu=host"])
    instance, device = shared_runtime(threads)
    module = rt.VmModule.copy_buffer(instance, vmfb)
    context = rt.VmContext(instance, [rt.create_hal_module(instance, device), module])
    return VmCall(context, device, module.lookup_function("f"), "partition 'p'")


@pytest.fixture(scope="module")
def types_call() -> Any:
    return _call(_TYPES)


@pytest.fixture(scope="module")
def dynamic_call() -> Any:
    return _call(_DYNAMIC)


def test_rank0_bool_int64_float16_and_zero_size_values_in_and_out(types_call: Any) -> None:
    got = types_call(
        [
            np.array(21, np.int64),
            np.array([True, False, True]),
            np.array([1.5, 2.0, -3.0], np.float16),
            np.zeros((0, 4), np.float32),
            np.array(3.0, np.float32),
        ]
    )
    expected = [
        np.array(42, np.int64),
        np.zeros(3, np.bool_),
        np.array([3.0, 4.0, -6.0], np.float16),
        np.zeros((0, 4), np.float32),
        np.array(9.0, np.float32),
    ]
    assert [(g.shape, g.dtype) for g in got] == [(e.shape, e.dtype) for e in expected]
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


def test_scalars_and_a_strided_view_are_passed_as_arrays(dynamic_call: Any) -> None:
    rows = np.arange(48, dtype=np.float32).reshape(12, 4)[::3]  # not C-contiguous
    assert not rows.flags.c_contiguous
    got = dynamic_call([rows, np.ones((4, 4), np.int64)])
    np.testing.assert_array_equal(got[0], rows * 2)

    types = _call(_TYPES)
    scalars = types(
        [5, np.array([True] * 3), np.ones(3, np.float16), np.zeros((0, 4), np.float32), np.float32(2)]
    )
    assert scalars[0].shape == () and int(scalars[0]) == 10  # a Python int: rank 0, int64
    assert scalars[4].shape == () and float(scalars[4]) == 4.0  # a numpy scalar: rank 0


def test_one_function_called_with_other_shapes_call_after_call(dynamic_call: Any) -> None:
    rng = np.random.default_rng(0)
    for rows in (1, 7, 0, 4096, 3, 1, 4096):  # small results copied, large ones (64 KiB) held, and back
        a = rng.standard_normal((rows, 4)).astype(np.float32)
        b = rng.integers(-100, 100, (rows, 4)).astype(np.int64)
        f, i = dynamic_call([a, b])
        assert f.shape == (rows, 4) and f.dtype == np.float32 and i.dtype == np.int64
        np.testing.assert_array_equal(f, a + a)
        np.testing.assert_array_equal(i, b * b)


def test_calls_from_several_threads_each_get_their_own_results(dynamic_call: Any) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def work(seed: int) -> None:
        try:
            start.wait()
            for k in range(60):
                rows = 1 + (seed * 60 + k) % 300  # some results small (copied), some held
                a = np.full((rows, 4), seed * 1000 + k, np.float32)
                b = np.full((rows, 4), seed + k, np.int64)
                f, i = dynamic_call([a, b])
                assert f.shape == (rows, 4) and np.all(f == 2 * (seed * 1000 + k)), (seed, k)
                assert np.all(i == (seed + k) ** 2), (seed, k)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_iree_failures_are_epfail_with_iree_message(types_call: Any, dynamic_call: Any) -> None:
    ok = [np.array(1, np.int64), np.zeros(3, np.bool_), np.zeros(3, np.float16), np.zeros((0, 4), np.float32)]
    with pytest.raises(EPFail, match=r"partition 'p': IREE failed to run it: .*element type mismatch"):
        types_call([*ok, np.array(1.0, np.float64)])  # f64 where the function takes f32
    with pytest.raises(EPFail, match=r"partition 'p': IREE failed to run it: .*rank mismatch"):
        types_call([np.ones(1, np.int64), *ok[1:], np.array(1.0, np.float32)])  # shape (1,) for a scalar
    with pytest.raises(EPFail, match=r"partition 'p': IREE failed to run it: .*(argument|arity|count)"):
        dynamic_call([np.ones((2, 4), np.float32)])  # one argument of two
    with pytest.raises(EPFail, match=r"IREE has no element type for <U1 arrays"):
        dynamic_call([np.array([["a"] * 4]), np.ones((1, 4), np.int64)])
    with pytest.raises(EPFail, match=r"IREE has no element type for >f4 arrays"):
        dynamic_call([np.ones((1, 4), ">f4"), np.ones((1, 4), np.int64)])
    # and the call still works afterwards
    np.testing.assert_array_equal(
        dynamic_call([np.ones((1, 4), np.float32), np.ones((1, 4), np.int64)])[0], 2.0
    )


def test_a_result_that_is_not_a_tensor_is_epfail() -> None:
    call = _call(_PRIMITIVE)
    with pytest.raises(EPFail, match=r"partition 'p': IREE returned 7 as result 0, not a tensor"):
        call([np.ones(2, np.float32)])


class _Everything(set[int]):
    def __contains__(self, item: object) -> bool:
        return True


def test_the_mapped_path_gives_the_same_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """Results read through a mapping (for element types this numpy does not take through DLPack) match."""
    from epctx.providers.iree import vmcall

    call = _call(_TYPES)
    feed = [
        np.array(-4, np.int64),
        np.array([True, True, False]),
        np.array([0.5, 1.0, 8.0], np.float16),
        np.zeros((0, 4), np.float32),
        np.array(-2.0, np.float32),
    ]
    exported = call(feed)
    monkeypatch.setattr(vmcall, "_UNEXPORTED", _Everything())
    mapped = call(feed)
    assert all(m.flags.owndata for m in mapped)  # small: copied
    assert [(m.shape, m.dtype) for m in mapped] == [(e.shape, e.dtype) for e in exported]
    for m, e in zip(mapped, exported):
        np.testing.assert_array_equal(m, e)


def test_an_element_type_dlpack_cannot_take_is_mapped_from_then_on(
    dynamic_call: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from epctx.providers.iree import vmcall

    monkeypatch.setattr(vmcall, "_UNEXPORTED", set())
    tried: list[int] = []
    export = dynamic_call._export

    def refusing(view: Any, *args: Any) -> Any:
        tried.append(view.element_type)
        if view.element_type == 0x21000020:  # float32: as an old numpy refuses bool
            raise BufferError("unsupported dtype")
        return export(view, *args)

    monkeypatch.setattr(dynamic_call, "_export", refusing)
    a, b = np.ones((3, 4), np.float32), np.full((3, 4), 3, np.int64)
    for _ in range(3):
        f, i = dynamic_call([a, b])
        np.testing.assert_array_equal(f, a * 2)
        np.testing.assert_array_equal(i, b * b)
        assert f.flags.owndata and not i.flags.owndata  # float32 mapped and copied, int64 exported
    assert set(vmcall._UNEXPORTED) == {0x21000020}
    assert tried.count(0x21000020) == 1  # asked once, then mapped without asking


def test_a_result_that_is_an_argument_does_not_alias_the_callers_array() -> None:
    call = _call(_PASSTHROUGH)
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    same, flat = call([x])
    x[:] = -1.0  # the caller reuses its array
    np.testing.assert_array_equal(same, np.arange(16, dtype=np.float32).reshape(4, 4))
    np.testing.assert_array_equal(flat, np.arange(16, dtype=np.float32))
    assert not np.shares_memory(same, x) and not np.shares_memory(flat, x)
