"""An IREE partition's results, returned as numpy arrays without a copy, keep IREE's buffers alive for as long
as the arrays live (issue 21). The mapped array alone did not: once IREE's result object was dropped, its
memory was reused while the array was still to be read -- MiniLM with IREE up to its 112th node and the CPU EP
after it returned sentence embeddings 0.17-0.28 off onnxruntime's, different at each run (the attention mask
IREE computed was read by the CPU EP's pooling a hundred nodes later). Tested on the EP's own call path
(``providers/iree/vmcall.py``, IREE's VM called directly)."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest

from tests.requires import requires

pytestmark = [pytest.mark.slow, requires("iree.runtime", "iree.compiler")]

_SOURCE = """
func.func @f(%a: tensor<1x8192xf32>) -> (tensor<1x8192xf32>, tensor<1x8192xf32>) {
  %0 = arith.mulf %a, %a : tensor<1x8192xf32>
  %1 = arith.addf %a, %a : tensor<1x8192xf32>
  return %0, %1 : tensor<1x8192xf32>, tensor<1x8192xf32>
}"""


def _call(source: str, threads: int) -> Any:
    """``@f`` of ``source`` compiled for this CPU, as the EP calls a partition (VmCall, IREE's VM direct)."""
    import iree.compiler as ic
    import iree.runtime as rt

    from epctx.providers.iree.runtime import shared_runtime
    from epctx.providers.iree.vmcall import VmCall

    vmfb = ic.compile_str(source, target_backends=["llvm-cpu"], extra_args=["--iree-llvmcpu-target-cpu=host"])
    instance, device = shared_runtime(threads)
    module = rt.VmModule.copy_buffer(instance, vmfb)
    context = rt.VmContext(instance, [rt.create_hal_module(instance, device), module])
    return VmCall(context, device, module.lookup_function("f"), "test")


@pytest.mark.parametrize("threads", [1, 0])
def test_a_result_array_keeps_its_iree_buffer_alive(threads: int) -> None:
    call = _call(_SOURCE, threads)
    arrays = call([np.full((1, 8192), 3.0, np.float32)])
    alive = [weakref.ref(a.base) for a in arrays]  # what holds each result's buffer view and mapping
    gc.collect()
    assert all(ref() is not None for ref in alive)  # held by the arrays
    for _ in range(20):  # memory churn, and more calls: the arrays read what IREE wrote
        call([np.full((1, 8192), 5.0, np.float32)])
        [np.full((1, 8192), 7.0, np.float32) for _ in range(50)]
    np.testing.assert_array_equal(arrays[0], np.full((1, 8192), 9.0, np.float32))
    np.testing.assert_array_equal(arrays[1], np.full((1, 8192), 6.0, np.float32))
    assert not arrays[0].flags.owndata  # 32 KiB: held, not copied
    del arrays
    gc.collect()
    assert all(ref() is None for ref in alive)  # and released with them


def test_a_small_result_is_a_copy_of_its_own() -> None:
    call = _call(_SMALL, 1)
    got, again = call([np.arange(64, dtype=np.float32)]), call([np.full(64, -1.0, np.float32)])
    assert got[0].flags.owndata and got[0].base is None  # 256 bytes: copied, IREE's buffer free for reuse
    np.testing.assert_array_equal(got[0], np.arange(64, dtype=np.float32) * 2)
    np.testing.assert_array_equal(again[0], np.full(64, -2.0, np.float32))


_SMALL = """
func.func @f(%a: tensor<64xf32>) -> tensor<64xf32> {
  %0 = arith.addf %a, %a : tensor<64xf32>
  return %0 : tensor<64xf32>
}"""
