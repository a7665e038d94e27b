"""The compile worker: ``python -m epctx.providers.iree.worker <job folder>`` (run by ``compile.py``; the only
module of this EP that imports ``iree.compiler``, never in the process that asked for the compile).

The job folder holds ``model.onnx`` (the partition; large weights as external data next to it) and
``job.json`` (``flags``: iree-compile flags; ``min_opset``; ``prelayout``: store conv filters channels-last, see
``prelayout_filters``; ``depthwise``: depthwise convolutions as shifted products, see ``depthwise``;
``space_to_depth``: strided stems over the space-to-depth of their input, see ``space_to_depth``;
``strided_pointwise``: strided 1x1 convolutions as matmuls over channels-last data, see ``pointwise``;
``nhwc_pools``: global average pools over channels-last data, see ``nhwc_pools``; ``upsamples``: nearest
upsampling as a broadcast, see ``upsample``; ``divisions``: HardSwish and divisions by constants as products, see
``reciprocals``; ``one_row_convs``: compiled in two phases, small data-tiled convolutions one output row per
workgroup between them, see ``workgroups``). The worker (``worker <job folder> <caller pid> [<MiB>]``)
ends with its caller, and ``iree-compile`` with the worker (``lifeline``); ``iree-compile`` is stopped when its
resident memory passes ``<MiB>`` (``run_capped``). It

1. loads the model, upgrades its default opset to ``min_opset`` when lower (IREE's importer fails on the older
   Softmax and friends), infers shapes;
2. imports it with IREE's ONNX importer, weights of at least ``PARAMETER_MIN_ELEMENTS`` elements externalized as
   ``#stream.parameter.named<"model"::"<key>">`` (no ``.irpa`` is written: the EP stores the weights itself);
3. runs ``iree-compile`` on the MLIR.

It writes ``result.json``: ``{"ok": true, "params": [[onnx initializer name, parameter key], ...],
"transposed": {onnx initializer name: permutation}}`` or
``{"ok": false, "stage": "import" | "compile" | "memory", "error": "..."}``; the ``.vmfb`` is ``module.vmfb``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from epctx.providers.iree.lifeline import die_with_parent, with_parent
from epctx.providers.iree.node_rewrites import PARAMETER_MIN_ELEMENTS

__all__ = [
    "BUDGET_STAGE",
    "MEMORY_STAGE",
    "PARAMS_SCOPE",
    "RUNTIME_EXPONENT",
    "RUNTIME_SHAPE",
    "SHAPELESS",
    "main",
    "run_capped",
]

PARAMS_SCOPE = "model"
_ERROR_CHARS = 4000
# Why a partition whose boundary holds a value typed without a shape is not given to IREE (also capability's)
SHAPELESS = (
    "value {name!r} crosses the partition boundary with a type but no shape: IREE's importer has no unknown "
    "rank and would read it as a scalar (rank 0)"
)
# ... and one whose input is the shape operand of a Reshape in it: IREE's Reshape takes -1 and 0 in a shape known
# only at run as sizes (a wrong allocation, RESOURCE_EXHAUSTED in hal.device.queue.alloca, or a wrong result)
RUNTIME_SHAPE = (
    "value {name!r}, the shape operand of Reshape {node!r}, would enter the partition at run time: IREE's "
    "Reshape mishandles -1 and 0 in a shape it does not know when compiling"
)
# ... and one whose input is the exponent of a Pow in it: IREE computes a power whose exponent it does not know
# when compiling as exp(y * log(x)), NaN for every negative base (the tiny LLM's RMS norm, x ** 2, in pieces: NaN
# logits), where ONNX's Pow squares it
RUNTIME_EXPONENT = (
    "value {name!r}, the exponent of Pow {node!r}, would enter the partition at run time: IREE's power with an "
    "exponent it does not know when compiling is NaN for a negative base"
)


def _fail(folder: Path, stage: str, error: str, rewritten: list[str]) -> int:
    text = error.strip()
    if len(text) > _ERROR_CHARS:
        text = text[:_ERROR_CHARS] + " [...]"
    doc = {"ok": False, "stage": stage, "error": text, "rewritten": rewritten}
    (folder / "result.json").write_text(json.dumps(doc), encoding="utf-8")
    return 0


def _optional(job: dict[str, Any], key: str, rewrite: Any, model: Any, rewritten: list[str]) -> None:
    """Make the optional rewrite ``key`` when the job asks for it, noting it in ``rewritten`` when it changed the
    graph (or raised): a failed job is tried again without the optional rewrites it made, only those."""
    if job.get(key):
        rewritten.append(key)
        if not rewrite(model):
            rewritten.pop()


def _load(
    folder: Path, job: dict[str, Any], rewritten: list[str] | None = None
) -> tuple[Any, dict[str, list[int]]]:
    import onnx

    from epctx.providers.iree.depthwise import constants_as_initializers, decompose_depthwise
    from epctx.providers.iree.nhwc_pools import global_pools_channels_last
    from epctx.providers.iree.pointwise import strided_pointwise_as_matmuls
    from epctx.providers.iree.reciprocals import divisions_as_products
    from epctx.providers.iree.space_to_depth import strided_stems_to_depth
    from epctx.providers.iree.upsample import nearest_upsamples_as_broadcasts

    model = onnx.load(str(folder / "model.onnx"))
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    min_opset = int(job["min_opset"])
    if version is not None and version < min_opset:
        model = onnx.version_converter.convert_version(model, min_opset)
    transposed: dict[str, list[int]] = {}
    if any(
        job.get(k) for k in ("depthwise", "space_to_depth", "upsamples", "strided_pointwise", "divisions")
    ):  # initializers
        constants_as_initializers(model.graph)
    # the rewrites that infer shapes first, before filters are stored transposed (their recorded shapes then stale)
    made = [] if rewritten is None else rewritten
    _optional(job, "space_to_depth", strided_stems_to_depth, model, made)
    _optional(job, "nhwc_pools", global_pools_channels_last, model, made)
    _optional(job, "upsamples", nearest_upsamples_as_broadcasts, model, made)
    _optional(job, "divisions", divisions_as_products, model, made)
    _optional(
        job, "strided_pointwise", lambda m: _stored(strided_pointwise_as_matmuls(m), transposed), model, made
    )
    if job.get("depthwise"):
        transposed.update(decompose_depthwise(model.graph, nhwc=bool(job.get("prelayout"))))
    if job.get("prelayout"):
        transposed.update(prelayout_filters(model.graph))
    # the shapes recorded for the filters stored transposed (a Constant's output has one) are the source's
    stale = [v for v in model.graph.value_info if v.name in transposed]
    for value in stale:
        model.graph.value_info.remove(value)
    model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    _check_boundaries(model)
    return model, transposed


def _stored(changed: dict[str, list[int]], transposed: dict[str, list[int]]) -> bool:
    """``changed`` (filters a rewrite stores permuted) noted in ``transposed``; whether there were any."""
    transposed.update(changed)
    return bool(changed)


def _check_boundaries(model: Any) -> None:
    """Refuse what IREE would misread: a boundary tensor without a shape (imported as a scalar), a Reshape
    whose shape comes from outside the partition (IREE 3.x mishandles -1 / 0 in a shape known only at run) and a
    Pow whose exponent does (NaN for a negative base)."""
    for value in [*model.graph.input, *model.graph.output]:  # IREE reads a tensor without a shape as a scalar
        if value.type.HasField("tensor_type") and not value.type.tensor_type.HasField("shape"):
            raise ValueError(SHAPELESS.format(name=value.name))
    inputs = {value.name for value in model.graph.input} - {t.name for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Reshape" and node.domain in ("", "ai.onnx") and node.input[1] in inputs:
            raise ValueError(RUNTIME_SHAPE.format(name=node.input[1], node=node.name))
        if node.op_type == "Pow" and node.domain in ("", "ai.onnx") and node.input[1] in inputs:
            raise ValueError(RUNTIME_EXPONENT.format(name=node.input[1], node=node.name))


# ONNX's OIHW filter -> HWIO ("HWCF"), the layout IREE's channels-last conversion gives a 2-D convolution's filter.
TO_HWCF = [2, 3, 1, 0]
_FROM_HWCF = [3, 2, 0, 1]


def prelayout_filters(graph: Any) -> dict[str, list[int]]:
    """Store each 2-D, ungrouped ``Conv`` filter initializer (read by that node only) in the layout IREE's
    channels-last conversion wants, behind a ``Transpose`` back to ONNX's: IREE folds the two transposes, and the
    module reads the parameter as stored, with no transpose in its initializer at each load. Returns the
    initializers changed: name -> permutation of the source array (the EP stores the weight so)."""
    from onnx import helper, numpy_helper

    from epctx.providers.iree.depthwise import input_uses

    uses = input_uses(graph)
    initializers = {t.name: t for t in graph.initializer}
    changed: dict[str, list[int]] = {}
    added = []
    for node in graph.node:
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or group != 1 or len(node.input) < 2:
            continue
        weight = initializers.get(node.input[1])
        if weight is None or len(weight.dims) != 4 or uses.get(weight.name) != 1 or weight.name in changed:
            continue
        array = numpy_helper.to_array(weight)
        weight.CopyFrom(numpy_helper.from_array(array.transpose(TO_HWCF).copy(), weight.name))
        source = f"{weight.name}__oihw"
        added.append(helper.make_node("Transpose", [weight.name], [source], perm=_FROM_HWCF))
        node.input[1] = source
        changed[weight.name] = TO_HWCF
    nodes = [*added, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    return changed


def _import(model: Any) -> tuple[str, list[list[str]]]:
    from iree.compiler.tools.import_onnx.importer_externalization_overrides import (  # type: ignore[import-untyped]
        Context,
        IREENodeImporter,
        ParamData,
        onnx_importer,
    )

    context = Context()
    info = onnx_importer.ModelInfo(model)
    module = info.create_module(context=context).operation
    params = ParamData(
        param_bit_threshold=None,
        num_elements_threshold=PARAMETER_MIN_ELEMENTS,
        params_scope=PARAMS_SCOPE,
        data_dir="",
        param_path="",
        input_index_threshold=None,
    )
    importer = IREENodeImporter.define_function(info.main_graph, module, params)
    importer.import_all()
    module.verify()
    # The importer keys each parameter by the initializer's name with ':' replaced by '_' (sanitize_name).
    keys = [[name, importer.sanitize_name(name)] for name, _ in importer.globals]
    if len({key for _, key in keys}) != len(keys):
        raise ValueError(f"two initializers map to the same IREE parameter name: {keys}")
    return module.get_asm(assume_verified=True), keys


# How often the resident memory of iree-compile is read against its cap: it grew by 0.4-2.5 GB/s on silero-vad's
# folded LSTM decoder, which it never finished (IREE 3.13: 23 GB after 26 s, then the kernel's OOM killer)
_POLL_S = 0.1
MEMORY_STAGE = "memory"  # the result's stage when the cap stopped the compile
BUDGET_STAGE = "budget"  # ... when the capability budget's end did (``compile.JobLimits``: the worker killed)


def run_capped(command: list[str], folder: Path, limit_mib: int) -> tuple[int, str, bool]:
    """Run ``command`` in ``folder`` (its output in files there, not pipes); stop it (SIGKILL) once its resident
    memory passes ``limit_mib`` (0: no cap; where ``/proc`` tells nothing, none either). Returns (exit status,
    its stderr or stdout, whether the cap stopped it)."""
    out, err = folder / "compile.out", folder / "compile.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr, cwd=folder, env=dict(os.environ))
        over = False
        while process.poll() is None:
            if limit_mib and _resident_mib(process.pid) > limit_mib:
                over = True
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(_POLL_S)
    text = err.read_text(errors="replace") or out.read_text(errors="replace")
    return process.returncode, text, over


def _resident_mib(pid: int) -> float:
    """The resident memory of process ``pid`` in MiB (0 where ``/proc`` does not say)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def _compile_tool() -> str:
    from iree.compiler.tools.binaries import find_tool  # type: ignore[import-untyped]

    return str(find_tool("iree-compile"))


def _compile(
    folder: Path, source: str, job: dict[str, Any], limit: int, rewritten: list[str]
) -> tuple[int, str, bool]:
    """iree-compile ``source`` into ``module.vmfb`` (``run_capped``'s result). With ``one_row_convs``, in two
    phases, IREE's lowering configurations changed between them (``workgroups``; noted in ``rewritten`` when it
    changed one, so a failed job is tried again without it)."""
    # relative names, run in the job folder: the module records its source's path, which must not be the
    # temporary folder's (the same model and options must give the same bytes)
    tool, flags = _compile_tool(), job["flags"]
    if not job.get("one_row_convs"):
        return run_capped(with_parent([tool, source, *flags, "-o", "module.vmfb"]), folder, limit)
    from epctx.providers.iree.workgroups import one_row_small_convs

    configs = "configs.mlir"
    first = with_parent([tool, source, *flags, f"--compile-to={_CONFIGURED}", "-o", configs])
    status, text, over = run_capped(first, folder, limit)
    if status != 0 or over:
        return status, text, over
    changed, count = one_row_small_convs((folder / configs).read_text(encoding="utf-8"))
    if count:
        (folder / configs).write_text(changed, encoding="utf-8")
        rewritten.append("one_row_convs")
    second = with_parent([tool, configs, *flags, f"--compile-from={_CONFIGURED}", "-o", "module.vmfb"])
    return run_capped(second, folder, limit)


_CONFIGURED = (
    "executable-configurations"  # the phase of iree-compile whose output holds the lowering configurations
)


def main(argv: list[str]) -> int:
    if len(argv) > 1:  # the pid of the process that asked for the compile: this worker ends with it
        die_with_parent(int(argv[1]))
    folder = Path(argv[0])
    job = json.loads((folder / "job.json").read_text(encoding="utf-8"))
    rewritten: list[str] = []  # the optional rewrites made (see _optional)
    try:
        model, transposed = _load(folder, job, rewritten)
        asm, keys = _import(model)
    except Exception as exc:  # the importer raises whatever its ops raise: all are "cannot import"
        return _fail(folder, "import", f"{type(exc).__name__}: {exc}", rewritten)
    mlir = folder / "module.mlir"
    mlir.write_text(asm, encoding="utf-8")
    del asm, model
    limit = int(argv[2]) if len(argv) > 2 else 0
    started = time.perf_counter()
    status, text, over = _compile(folder, mlir.name, job, limit, rewritten)
    if over:
        return _fail(folder, MEMORY_STAGE, f"iree-compile passed {limit} MiB of memory after "
                     f"{time.perf_counter() - started:.1f} s and was stopped (provider option compile_memory_mb)",
                     rewritten)  # fmt: skip
    if status != 0:
        return _fail(folder, "compile", text or f"exit status {status}", rewritten)
    (folder / "result.json").write_text(
        json.dumps({"ok": True, "params": keys, "transposed": transposed}), encoding="utf-8"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
