"""Compiling partitions out of process: each partition is written as an ONNX model into a temporary folder and
``python -m epctx.providers.iree.worker`` imports and compiles it there (the compiler never enters this
process), partitions in parallel up to ``os.cpu_count()``, each logged when it starts and ends. A worker dies
with this process (``lifeline``); a folder left by a process that died is removed by the next compile."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from epctx.ep import CompileGuard, Partition, ir_nodes, partition_model, plan_weights_file
from epctx.errors import EPFail, InvalidArgument
from epctx.providers.iree.lifeline import job_folder, remove_stale_folders
from epctx.providers.iree.nhwc_pools import POOLS
from epctx.providers.iree.options import (
    CONV_DATA_TILING,
    CONV_TILING_FALLBACK,
    FAST_1D_CONVS,
    FAST_CODEGEN,
    MATMUL_DATA_TILING,
    NAMED_PRODUCT_DATA_TILING,
    ONE_ROW_SMALL_CONVS,
    REWRITE_DEPTHWISE,
    REWRITE_DIVISIONS,
    REWRITE_NEAREST_UPSAMPLES,
    REWRITE_NHWC_POOLS,
    REWRITE_STRIDED_STEMS,
    STATIC_DATA_TILING,
    with_flags,
)
from epctx.providers.iree.space_to_depth import MAX_CHANNELS
from epctx.providers.iree.worker import BUDGET_STAGE, MEMORY_STAGE
from epctx.providers.iree.workgroups import MAX_ROWS

__all__ = ["BUDGET_STAGE", "CompileResult", "JobLimits", "compile_partitions", "memory_cap"]

logger = logging.getLogger("epctx")

MIN_OPSET = 17  # IREE's ONNX importer fails on older Softmax / ReduceX semantics: upgrade below this
_EXTERNAL_MIN_BYTES = 1024  # larger initializers reach the worker as external data, not in the protobuf
_TIMEOUT_S = 3600
CHANNELS_LAST_PASS = "iree-preprocessing-convert-conv-to-channels-last"
# markers among the flags, never for iree-compile
REWRITES = frozenset(
    {
        REWRITE_DEPTHWISE,
        REWRITE_STRIDED_STEMS,
        REWRITE_NHWC_POOLS,
        REWRITE_NEAREST_UPSAMPLES,
        REWRITE_DIVISIONS,
        ONE_ROW_SMALL_CONVS,
        FAST_1D_CONVS,
        CONV_TILING_FALLBACK,
        STATIC_DATA_TILING,
    }
)
_CONV_TILING = CONV_DATA_TILING[-2]  # the flag that asks for the data tiling of convolutions
# Compile results of this process by the content of the job (the partition's model, its weights, the flags): a
# second session of the same model, or the compile after a capability check, does not compile again.
_CACHE: dict[str, CompileResult] = {}
_CACHE_SIZE = 64
_CACHE_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True, slots=True)
class CompileResult:
    """The outcome of one partition's compile: the ``.vmfb`` and its parameters (ONNX initializer name, IREE
    parameter key), or the stage that failed and IREE's message."""

    ok: bool
    vmfb: bytes = b""
    params: tuple[tuple[str, str], ...] = ()
    # ONNX initializer name -> the permutation of its array IREE's parameter holds (filters stored channels-last)
    transposed: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    stage: str = ""
    error: str = ""
    seconds: float = 0.0
    # the optional rewrites (job keys) a failed job made: it is tried again without them (``_run_one``)
    rewritten: tuple[str, ...] = ()


def entry_name(partition: Partition) -> str:
    """The ONNX graph name given to IREE (its function is named after it; loading looks the name up)."""
    return re.sub(r"\W", "_", partition.name or "partition") or "partition"


def _write_job(partition: Partition, folder: Path, flags: Sequence[str]) -> None:
    plan = plan_weights_file(partition.initializers, location="weights.bin", min_size=_EXTERNAL_MIN_BYTES)
    model = partition_model(partition, weights=plan.refs, graph_name=entry_name(partition))
    if plan.arrays:
        plan.write(folder)
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    # Channels-last convolutions: their filters are stored in that layout (``worker.prelayout_filters``), not
    # transposed by the module at each load.
    optional = _optional_rewrites(partition, flags)
    job = {
        "flags": _job_flags(partition, flags),
        "min_opset": MIN_OPSET,
        "prelayout": any(CHANNELS_LAST_PASS in f for f in flags),
        "depthwise": REWRITE_DEPTHWISE in flags,
        "space_to_depth": REWRITE_STRIDED_STEMS in optional,
        "strided_pointwise": REWRITE_STRIDED_STEMS in optional,
        "nhwc_pools": REWRITE_NHWC_POOLS in optional,
        "upsamples": REWRITE_NEAREST_UPSAMPLES in optional,
        "divisions": REWRITE_DIVISIONS in optional,
        "one_row_convs": ONE_ROW_SMALL_CONVS in optional,
    }
    (folder / "job.json").write_text(json.dumps(job), encoding="utf-8")


def _job_flags(partition: Partition, flags: Sequence[str]) -> list[str]:
    """The iree-compile flags of a job: the markers out, the fast code generation's in for a partition holding a
    one-dimensional convolution when ``FAST_1D_CONVS`` asks, the data tiling of matrix products and convolutions for
    one whose shapes are known when ``STATIC_DATA_TILING`` does (of its matrix products only where it holds grouped
    convolutions, of its named ones only where its 1x1 convolutions are mostly narrow too)."""
    kept = [f for f in flags if f not in REWRITES]
    nodes = list(ir_nodes(partition.nodes))
    if FAST_1D_CONVS in flags and any(_one_dimensional(n) for n in nodes):
        kept = with_flags(kept, FAST_CODEGEN)
    if STATIC_DATA_TILING in flags and _static_products(partition) and FAST_CODEGEN[0] not in kept:
        tiling = CONV_DATA_TILING
        if any(_grouped(n) for n in nodes):  # depthwise nets run slower with convolution data tiling
            tiling = NAMED_PRODUCT_DATA_TILING if _narrow_pointwise(nodes) else MATMUL_DATA_TILING
        kept = with_flags(kept, tiling)
    return kept


# the job key of each optional rewrite -> its marker among the flags
_JOB_KEYS = {
    "space_to_depth": REWRITE_STRIDED_STEMS,
    "strided_pointwise": REWRITE_STRIDED_STEMS,
    "nhwc_pools": REWRITE_NHWC_POOLS,
    "upsamples": REWRITE_NEAREST_UPSAMPLES,
    "divisions": REWRITE_DIVISIONS,
    "one_row_convs": ONE_ROW_SMALL_CONVS,
}


def _optional_rewrites(partition: Partition, flags: Sequence[str]) -> list[str]:
    """The rewrites asked for among ``flags`` that a job of ``partition`` makes, each a speed-up its compile may do
    without (a failed job is tried again without those it made: ``worker._optional``):

    - strided stems over the space-to-depth of their input (``space_to_depth``) and strided 1x1 convolutions as
      matmuls over channels-last data (``pointwise``): where its convolutions are data-tiled (the rewrites are what
      make those fast under that tiling; untiled, a stem is fast as it is) and such a convolution is in it;
    - global average pools and max pools over NHWC data (``nhwc_pools``): compiled channels-last, with such a pool;
    - nearest upsampling as a broadcast (``upsample``): with a ``Resize``;
    - HardSwish and divisions by constants as products (``reciprocals``): with a ``HardSwish`` or a ``Div``;
    - one output row per workgroup (``workgroups``): for an x86-64 target, convolutions data-tiled, one of them over a
      small image."""
    nodes = list(ir_nodes(partition.nodes))
    found = []
    convs_tiled = _CONV_TILING in _job_flags(partition, flags)
    if REWRITE_STRIDED_STEMS in flags and convs_tiled:
        found += (
            [REWRITE_STRIDED_STEMS] if any(_strided_stem(n) or _strided_pointwise(n) for n in nodes) else []
        )
    if REWRITE_NHWC_POOLS in flags and any(CHANNELS_LAST_PASS in f for f in flags):
        found += [REWRITE_NHWC_POOLS] if any(n.op_type in POOLS for n in nodes) else []
    if REWRITE_NEAREST_UPSAMPLES in flags and any(n.op_type == "Resize" for n in nodes):
        found.append(REWRITE_NEAREST_UPSAMPLES)
    if REWRITE_DIVISIONS in flags and any(n.op_type in ("HardSwish", "Div") for n in nodes):
        found.append(REWRITE_DIVISIONS)
    x86 = any(f.startswith("--iree-llvmcpu-target-triple=x86_64") for f in flags)  # where it was measured
    if ONE_ROW_SMALL_CONVS in flags and x86 and convs_tiled:
        found += [ONE_ROW_SMALL_CONVS] if any(_small_conv(n) for n in nodes) else []
    return found


def _small_conv(node: Any) -> bool:
    """An ungrouped 2-D Conv whose output is known and at most ``workgroups.MAX_ROWS`` high and wide."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or _grouped(node) or not node.outputs:
        return False
    shape = getattr(node.outputs[0], "shape", None)
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape[2:]):
        return False
    return max(shape[2], shape[3]) <= MAX_ROWS


def _strided_stem(node: Any) -> bool:
    """A Conv of stride 2 over at most ``space_to_depth.MAX_CHANNELS`` channels (the worker checks the rest)."""
    shape = _stride_2_conv_filter(node)
    return shape is not None and len(shape) == 4 and isinstance(shape[1], int) and shape[1] <= MAX_CHANNELS


def _strided_pointwise(node: Any) -> bool:
    """A 1x1 Conv of stride 2 (the worker checks the rest: ``pointwise``)."""
    shape = _stride_2_conv_filter(node)
    return shape is not None and list(shape)[2:] == [1, 1]


def _stride_2_conv_filter(node: Any) -> Any:
    """The filter's shape of a Conv of strides [2, 2] (None for another node, or where the shape is unknown)."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return None
    strides = node.attributes.get("strides")
    if strides is None or list(strides.value) != [2, 2]:
        return None
    return getattr(node.inputs[1], "shape", None)


_PRODUCTS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "MatMulInteger", "ConvInteger"})


def _grouped(node: Any) -> bool:
    group = node.attributes.get("group")
    return node.op_type == "Conv" and group is not None and group.value != 1


_WIDE_CHANNELS = 128


def _narrow_pointwise(nodes: Sequence[Any]) -> bool:
    """Whether most of the work of the 1x1 convolutions among ``nodes`` (group 1, shapes known; work: multiply-adds)
    is in narrow ones, with fewer than ``_WIDE_CHANNELS`` channels in or out (options.NAMED_PRODUCT_DATA_TILING)."""
    narrow = wide = 0
    for node in nodes:
        if node.op_type != "Conv" or _grouped(node) or len(node.inputs) < 2 or not node.outputs:
            continue
        w, y = getattr(node.inputs[1], "shape", None), getattr(node.outputs[0], "shape", None)
        dims = [*w, *y] if w is not None and y is not None else []
        if len(dims) != 8 or not all(isinstance(d, int) for d in dims) or dims[2:4] != [1, 1]:
            continue
        work = dims[0] * dims[1] * dims[6] * dims[7]
        if min(dims[0], dims[1]) < _WIDE_CHANNELS:
            narrow += work
        else:
            wide += work
    return narrow > wide


def _static_products(partition: Partition) -> bool:
    """A partition with a matrix product or a convolution whose inputs' shapes are all known."""
    static = all(
        (shape := getattr(v, "shape", None)) is not None and all(isinstance(d, int) for d in shape)
        for v in partition.inputs
    )
    return static and any(n.op_type in _PRODUCTS for n in ir_nodes(partition.nodes))


def _one_dimensional(node: Any) -> bool:
    """A Conv over 1-D data, or a 2-D one whose input and kernel are 1 wide along one spatial axis and longer
    than 1 along the other (magika's 5x1 over a 1-wide image), shapes known."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return False
    x, w = node.inputs[0], node.inputs[1]
    xs, ws = getattr(x, "shape", None), getattr(w, "shape", None)
    if xs is None or ws is None or len(xs) != len(ws):
        return False
    if len(xs) == 3:
        return True
    if len(xs) != 4:
        return False
    dims = [(xs[a], ws[a]) for a in (2, 3)]
    unit = [d == (1, 1) for d in dims]
    return (
        any(unit)
        and not all(unit)
        and all(isinstance(v, int) and v > 1 for d in dims if d != (1, 1) for v in d)
    )


def _worker_env() -> dict[str, str]:
    """The environment of a worker: this process's, with the folder epctx is imported from first on the path."""
    root = str(Path(__file__).resolve().parents[3])  # the folder holding the epctx package
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def _job_key(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class JobLimits:
    """What stops a compile before its end: its ``iree-compile`` past ``memory_mib`` MiB of resident memory (0: no
    cap), the worker at ``deadline`` (``time.perf_counter()``; None: the compile timeout only)."""

    memory_mib: int = 0
    deadline: float | None = None


NO_LIMITS = JobLimits()
_STOPPED = (MEMORY_STAGE, BUDGET_STAGE)  # a limit's outcomes, not the node set's: no variant tried, none kept


def _run_one(
    partition: Partition, flags: Sequence[str], label: str, limits: JobLimits = NO_LIMITS
) -> CompileResult:
    result = _run_job(partition, flags, label, limits)
    if result.stage in _STOPPED:  # no variant of it is tried: each would take as long
        return result
    optional = [_JOB_KEYS[key] for key in result.rewritten] if not result.ok else []
    if optional:  # speed-ups, not needs: again without those the failed job made
        logger.info("%s: IREE %s failed with %s, again without", label, result.stage, ", ".join(optional))
        flags = [f for f in flags if f not in optional]
        result = _run_job(partition, flags, label, limits)
    job = set(_job_flags(partition, flags))
    tiled = STATIC_DATA_TILING in flags and bool(job & {CONV_DATA_TILING[0], NAMED_PRODUCT_DATA_TILING[0]})
    if not result.ok and result.stage == "compile" and tiled:  # the data tiling is an option, not a need
        logger.info("%s: IREE compile failed with data tiling, again without it", label)
        return _run_job(partition, [f for f in flags if f != STATIC_DATA_TILING], label, limits)
    return result


def _run_job(
    partition: Partition, flags: Sequence[str], label: str, limits: JobLimits = NO_LIMITS
) -> CompileResult:
    start = time.perf_counter()
    with job_folder() as name:  # removed after, or by a later compile when this process dies first
        folder = Path(name)
        _write_job(partition, folder, flags)
        key = _job_key(folder)
        with _CACHE_LOCK:
            known = _CACHE.get(key)
        if known is not None:
            logger.info("%s: %d node(s), compiled before in this process (%s)", label, len(partition.nodes),
                        "ok" if known.ok else "failed")  # fmt: skip
            return known
        logger.info("%s: compiling %d node(s) with IREE", label, len(partition.nodes))
        result = _compile_job(folder, label, start, limits)
    if result.stage in _STOPPED:  # a limit's, not the node set's: not kept (a larger one may pass it)
        return result
    with _CACHE_LOCK:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = result
    return result


def _compile_job(folder: Path, label: str, start: float, limits: JobLimits = NO_LIMITS) -> CompileResult:
    command = [sys.executable, "-m", "epctx.providers.iree.worker", str(folder), str(os.getpid()),
               str(limits.memory_mib)]  # fmt: skip
    timeout = _TIMEOUT_S if limits.deadline is None else min(_TIMEOUT_S, max(0.0, limits.deadline - start))
    try:  # past the timeout the worker is killed, and iree-compile with it (``lifeline``)
        done = subprocess.run(command, capture_output=True, text=True, env=_worker_env(), timeout=timeout)
    except subprocess.TimeoutExpired:
        seconds = time.perf_counter() - start
        if timeout < _TIMEOUT_S:
            logger.info("%s: stopped after %.1f s, at the capability budget's end", label, seconds)
            return CompileResult(False, stage=BUDGET_STAGE, seconds=seconds,
                                 error=f"stopped after {seconds:.1f} s: IREE's capability budget ran out during "
                                       "this compile (provider option capability_budget_s)")  # fmt: skip
        return CompileResult(False, stage="compile", error=f"timed out after {_TIMEOUT_S} s")
    result_file = folder / "result.json"
    if done.returncode != 0 or not result_file.is_file():
        detail = (done.stderr or done.stdout).strip()[-2000:]
        raise EPFail(f"{label}: the IREE compile worker failed (exit status {done.returncode}): {detail}")
    doc = json.loads(result_file.read_text(encoding="utf-8"))
    seconds = time.perf_counter() - start
    if not doc["ok"]:
        logger.info("%s: IREE %s failed after %.1f s", label, doc["stage"], seconds)
        _refuse_bad_flags(doc["error"])
        made = tuple(str(key) for key in doc.get("rewritten", ()))
        return CompileResult(False, stage=doc["stage"], error=doc["error"], seconds=seconds, rewritten=made)
    vmfb = (folder / "module.vmfb").read_bytes()
    logger.info("%s: compiled in %.1f s (%d bytes of code)", label, seconds, len(vmfb))
    params = tuple((str(a), str(b)) for a, b in doc["params"])
    transposed = {str(k): tuple(int(i) for i in v) for k, v in doc.get("transposed", {}).items()}
    return CompileResult(True, vmfb=vmfb, params=params, transposed=transposed, seconds=seconds)


# iree-compile's words for flags it cannot parse (LLVM's command-line library): every compile would fail alike.
_BAD_FLAG = re.compile(r"iree-compile: (Unknown command line argument|for the -[\w-]+ option: )")


def _refuse_bad_flags(error: str) -> None:
    """A compile that fails on its flags is the user's to fix (provider option ``compile_flags``), not a node
    IREE declines: raise, rather than let the capability search probe every piece in vain."""
    found = _BAD_FLAG.search(error)
    if found is not None:
        line = error[found.start() :].splitlines()[0]
        raise InvalidArgument(f"IREEExecutionProvider: iree-compile refuses its flags ({line}); check the "
                              "provider option compile_flags")  # fmt: skip


_MIN_CAP_MIB = 2048


def memory_cap(workers: int) -> int:
    """The resident memory, in MiB, each of ``workers`` compiles running at once may use unless the provider
    option ``compile_memory_mb`` says: half the machine's physical memory shared among them, at least ``_MIN_CAP_MIB``;
    0 (no cap) where the machine does not say. A compile IREE cannot finish may take all memory: silero-vad's
    folded LSTM decoder grew to 23 GB in 26 s, two of them at once, until the kernel's OOM killer ended one."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1 << 20)
    except (ValueError, OSError, AttributeError):
        return 0
    return max(_MIN_CAP_MIB, total // 2 // max(1, workers))


def compile_partitions(
    partitions: Sequence[Partition],
    flags: Sequence[str],
    guard: CompileGuard,
    *,
    ep_name: str = "IREEExecutionProvider",
    what: str = "partition",
    on_done: Callable[[Partition], None] | None = None,
    memory_mib: int = 0,
    deadline: float | None = None,
) -> list[CompileResult]:
    """Compile each partition in a worker process, up to ``os.cpu_count()`` at a time; results in order. The
    only place that starts a worker: ``guard`` is checked first. ``on_done(partition)`` as each one ends
    (from a pool thread). Each ``iree-compile`` is stopped past ``memory_mib`` MiB of resident memory (0: the
    share of ``memory_cap``), failing with stage ``"memory"``; each worker still running at ``deadline``
    (``time.perf_counter()``) is stopped, failing with stage ``"budget"``."""
    if not partitions:
        return []
    guard.check(ep_name, len(partitions), "" if what == "partition" else f"for its {what}")
    for path in remove_stale_folders():
        logger.info("removed %s, the IREE compile folder of a process that has ended", path)
    total = len(partitions)
    labels = [f"IREE {what} {p.name!r} [{k + 1}/{total}]" for k, p in enumerate(partitions)]
    workers = max(1, min(total, os.cpu_count() or 1))
    limits = JobLimits(memory_mib or memory_cap(workers), deadline)

    def one(partition: Partition, label: str) -> CompileResult:
        result = _run_one(partition, flags, label, limits)
        if on_done is not None and result.ok:
            on_done(partition)
        return result

    if workers == 1:
        return [one(p, label) for p, label in zip(partitions, labels)]
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="epctx-iree") as pool:
        futures = [pool.submit(one, p, label) for p, label in zip(partitions, labels)]
        return [f.result() for f in futures]
