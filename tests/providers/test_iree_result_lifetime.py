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


@pytest.fixture(params=["exported", "mapped"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How results reach numpy: DLPack (the array owns IREE's buffer), or a mapping (the path for an element
    type this numpy does not take through DLPack), forced here for float32."""
    from epctx.providers.iree import vmcall

    if request.param == "mapped":
        monkeypatch.setattr(vmcall, "_UNEXPORTED", {0x21000020})  # IREE's float32
    return str(request.param)


def _live_bytes(call: Any) -> int:
    call._allocator.trim()  # the caching allocator's retained buffers (runtime._ALLOCATOR) go back first
    stats = call._allocator.statistics
    return int(stats.get("device_bytes_allocated", 0) - stats.get("device_bytes_freed", 0))


@pytest.mark.parametrize("threads", [1, 0])
def test_a_result_array_keeps_its_iree_buffer_alive(threads: int, path: str) -> None:
    call = _call(_SOURCE, threads)
    before = _live_bytes(call)
    arrays = call([np.full((1, 8192), 3.0, np.float32)])
    gc.collect()
    held = _live_bytes(call) - before
    for _ in range(20):  # memory churn, and more calls: the arrays read what IREE wrote
        call([np.full((1, 8192), 5.0, np.float32)])
        [np.full((1, 8192), 7.0, np.float32) for _ in range(50)]
    np.testing.assert_array_equal(arrays[0], np.full((1, 8192), 9.0, np.float32))
    np.testing.assert_array_equal(arrays[1], np.full((1, 8192), 6.0, np.float32))
    assert not arrays[0].flags.owndata  # 32 KiB: held, not copied
    if path == "exported":
        assert type(arrays[0].base).__name__ == "PyCapsule"  # the DLPack capsule, which retains the buffer
    else:
        holder = arrays[0].base
        assert type(holder).__name__ == "_Holder"
        alive = weakref.ref(holder)  # what keeps the buffer view and its mapping
        del holder
    del arrays
    gc.collect()
    if path == "mapped":
        assert alive() is None  # released with the arrays
    if threads == 1:  # the inline device's allocator counts them (local-task's pool does not show here)
        assert held >= 2 * 32768  # held by the arrays
        assert _live_bytes(call) == before  # and released with them


def test_a_small_mapped_result_is_a_copy_of_its_own(path: str) -> None:
    call = _call(_SMALL, 1)
    got, again = call([np.arange(64, dtype=np.float32)]), call([np.full(64, -1.0, np.float32)])
    if path == "mapped":
        assert got[0].flags.owndata and got[0].base is None  # 256 bytes: copied, IREE's buffer free for reuse
    else:
        assert not got[0].flags.writeable  # numpy's DLPack import: read-only, over IREE's buffer
    np.testing.assert_array_equal(got[0], np.arange(64, dtype=np.float32) * 2)
    np.testing.assert_array_equal(again[0], np.full(64, -2.0, np.float32))


_SMALL = """
func.func @f(%a: tensor<64xf32>) -> tensor<64xf32> {
  %0 = arith.addf %a, %a : tensor<64xf32>
  return %0 : tensor<64xf32>
}"""
