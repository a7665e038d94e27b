"""IREEExecutionProvider: partitions compiled ahead of time by IREE for ``llvm-cpu``, loaded in milliseconds.

- ``get_capability`` compiles the candidate nodes (``capability``; the session's compile guard first),
  declining with IREE's reason the nodes it cannot import or compile, and returns as ``Capability.groups`` the
  cycle-free groups whose compiles passed; those compiles are the capability's artefacts;
- ``compile`` reuses those artefacts when the partition is one checked, else compiles all the partitions out
  of process (``compile``), in parallel; the weights stay the model's arrays, served to IREE as parameters;
- ``save_partition`` stores the ``.vmfb`` (code only) and each weight as a ``weights`` entry
  (``context``); ``load_partition`` maps them back (``params``, ``runtime``), importing ``iree.runtime`` only.

Targets (``targets``): ``hardware()`` records the triple and CPU features; ``check_context`` refuses a binary
for another triple or one needing features this CPU lacks, naming them.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from epctx.ep import (
    Capability,
    CapabilityContext,
    CompileContext,
    CompiledPartition,
    ExecutionProvider,
    Partition,
    SourceFile,
    SourcePlanner,
    WeightRef,
    initializer_array,
    ir_nodes,
    is_ep_context,
    open_sources,
)
from epctx.errors import EPFail, InvalidGraph
from epctx.providers.iree import compatibility
from epctx.providers.iree.compatibility import iree_version
from epctx.providers.iree.context import read_meta, write_entries
from epctx.providers.iree.options import (
    CONV_TILING_FALLBACK,
    FAST_1D_CONVS,
    FAST_CODEGEN,
    ONE_ROW_SMALL_CONVS,
    REWRITE_DEPTHWISE,
    REWRITE_DIVISIONS,
    REWRITE_NEAREST_UPSAMPLES,
    REWRITE_NHWC_POOLS,
    REWRITE_STRIDED_STEMS,
    STATIC_DATA_TILING,
    parse,
)
from epctx.providers.iree.params import Parameters
from epctx.providers.iree.runtime import CompiledIREE, Runner, load_module
from epctx.providers.iree.targets import missing_features

if TYPE_CHECKING:
    import onnx_ir as ir

    from epctx.ep import (
        CompatibilityVerdict,
        ContextReader,
        ContextWriter,
        DeviceIncompatibility,
        EPContextNode,
        HardwareDevice,
    )
    from epctx.providers.iree.compile import CompileResult
    from epctx.providers.iree.probing import Probes

    # The check's successful compiles, node set -> (partition checked, result).
    Checked = Mapping[frozenset[ir.Node], tuple[Partition, CompileResult]]

__all__ = ["IREEExecutionProvider", "iree_version"]

logger = logging.getLogger("epctx")

# NCHW convolutions (ONNX's layout) run about 3x faster on IREE's CPU backend once converted to NHWC, and the
# time to a first result is shorter too; the filters are then transposed by the module's initializer at load (the
# weights are parameters, unknown when compiling), a copy per session.
CHANNELS_LAST = "--iree-preprocessing-pass-pipeline=" + (
    "builtin.module(util.func(iree-preprocessing-convert-conv-to-channels-last))"
)  # 2-D ungrouped conv filters are stored in that layout at compile (worker.prelayout_filters): no load copy


# IREE's CPU data tiling and convolutions as im2col + matmul (options.FAST_CODEGEN; provider option fast_codegen):
# IREE's direct convolution code is slow on one-dimensional convolutions (magika's 5x1 convolution over a 1-wide
# image: 538 ms alone, 7.9 ms as im2col + data-tiled matmul), and these flags make others slower (3x3
# convolutions: ResNet-18, a YOLO) and the compile longer (the YOLO 19 -> 128 s), and fail on some (PP-OCRv4
# det: a 1x1 convolution over a 1x1 image): by default ("auto") only for partitions with 1-D convolutions.


# IREE refuses a dispatch whose stack allocations pass 32 KiB by default: MiniLM with its shapes stated (1 x 128
# tokens) failed so ("exceeded stack allocation limit of 32768 bytes ... Got 37056 bytes") and ran on the CPU EP;
# 64 KiB compiled it whole (7 s, 3.3e-6 from onnxruntime). A YOLOX detector (ddddocr's, 416x416) failed at 64 KiB
# in its data-tiled objectness head (a 1x1 convolution of 96 channels into 1 over 52x52: 198656 bytes) and, compiled
# untiled instead, ran 114 ms where the data-tiled code runs 63 (onnxruntime: 38): 256 KiB. The task workers get
# stacks for it (``runtime.WORKER_STACK_BYTES``: IREE's own 128 KiB crashed there); the calling thread, with one
# thread, has the process's.
STACK_LIMIT = "--iree-llvmcpu-stack-allocation-limit=262144"


def _parameter_sources(partition: Partition) -> dict[str, ir.TensorProtocol]:
    """The tensors IREE's importer may make parameters of, by name: the partition's initializers and the values
    of its ``Constant`` nodes (``value`` attribute: Paddle exports hold every weight so)."""
    found: dict[str, ir.TensorProtocol] = {}
    for node in partition.nodes:
        value = node.attributes.get("value")
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and value is not None:
            tensor = value.value
            output = node.outputs[0].name if len(node.outputs) == 1 else None
            if output and tensor is not None and hasattr(tensor, "numpy"):
                found[output] = tensor
    found.update(
        (v.name, v.const_value) for v in partition.initializers if v.name and v.const_value is not None
    )
    return found


class IREEExecutionProvider(ExecutionProvider):
    name = "IREEExecutionProvider"
    sources = ("IREEExecutionProvider", "IREE")
    compiles = True
    compiled_type = CompiledIREE
    intra_op_threads_option = "num_threads"  # the task workers of IREE's CPU device
    # An IREE module does not hold its weights (they are parameters): in weightless mode they are mapped from
    # the source's files at load (external data in EXTERNAL_ONLY, the .onnx too in ALL).
    weightless_supported_modes = "all_or_external_only"
    refits = True  # the same code serves other weights (refit.py)
    # A call into an IREE module and the copies at its boundary cost tens of microseconds: a partition of a few
    # light ops (shape arithmetic, element-wise glue between CPU nodes) is left to the next EP.
    min_partition_nodes = 8
    static_shapes_help = True  # dynamic-dim code runs 1.1-2.2x slower than static (epctx.specialize_shapes)

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self.config = parse(self.options)
        self.target = self.config.resolved()

    def flags(self) -> list[str]:
        flags = [*self.target.compile_flags(), f"--iree-opt-level={self.config.opt_level}", STACK_LIMIT]
        flags += [REWRITE_NEAREST_UPSAMPLES, REWRITE_DIVISIONS, ONE_ROW_SMALL_CONVS]
        if self.config.channels_last:
            flags += [CHANNELS_LAST, REWRITE_NHWC_POOLS]
        if self.config.depthwise_rewrite:
            flags.append(REWRITE_DEPTHWISE)
        if self.config.fast_codegen == "1":
            flags += FAST_CODEGEN
        elif self.config.fast_codegen == "auto":
            flags += [FAST_1D_CONVS, STATIC_DATA_TILING]
        if self.config.channels_last and self.config.fast_codegen != "0":
            flags.append(CONV_TILING_FALLBACK)
        if self.config.fast_codegen != "0":  # in the jobs whose convolutions are data-tiled
            flags.append(REWRITE_STRIDED_STEMS)
        return flags + shlex.split(self.config.compile_flags)

    # -- capability -----------------------------------------------------------------------------------
    def get_capability(
        self, graph: ir.Graph, opset_imports: Mapping[str, int], ctx: CapabilityContext
    ) -> Capability:
        if any(is_ep_context(n) and self._owns(n) for n in graph):
            return Capability()  # a context model: its other nodes were offered to IREE when it was generated
        if ctx.reuse.get(self.name):  # refit: the nodes the context's graphs were compiled from, checked
            from epctx.providers.iree.refit import claim

            recorded, refits = claim(graph, ctx.reuse[self.name], self.name)
            return Capability(groups=tuple(map(tuple, recorded)), artefacts=refits)
        # Capability and compiling import onnx-ir and IREE's compiler tools: here, never on the load path.
        from epctx.providers.iree.capability import candidate_nodes
        from epctx.providers.iree.probing import check_nodes

        nodes, declined = candidate_nodes(graph, self.config.disabled_ops, ctx.assigned)
        verdict = check_nodes(
            self.name,
            graph,
            opset_imports,
            nodes,
            self.flags(),
            ctx.guard,
            layout_flag=CHANNELS_LAST if self.config.channels_last else None,
            budget_s=self.config.capability_budget_s,
            partitions=ctx.assigned_partitions,
            memory_mib=self.config.compile_memory_mb,
        )
        declined.update(verdict.declined)
        for node, why in declined.items():
            logger.info("%s declines node %r (%s): %s", self.name, node.name, node.op_type, why)
        # The groups its check compiled: the partitioner makes each one partition, the one compile reused.
        groups = tuple(tuple(group) for group in verdict.groups)
        return Capability(groups=groups, declined=declined, artefacts=verdict.probes)

    def _owns(self, node: ir.Node) -> bool:
        value = getattr(node.attributes.get("source"), "value", None)
        return isinstance(value, str) and self.accepts_source(value)

    # -- compile --------------------------------------------------------------------------------------
    def compile(self, partitions: Sequence[Partition], ctx: CompileContext) -> list[CompiledPartition]:
        """All partitions at once: those the capability check compiled are reused, the others compile in
        parallel workers, each reported as its worker ends."""
        from epctx.providers.iree.compile import compile_partitions
        from epctx.providers.iree.refit import Refits

        if isinstance(ctx.artefacts, Refits):  # refit: the context's code, nothing compiled
            reused = [ctx.artefacts.result_for(p) for p in partitions]
            for partition in partitions:
                ctx.progress(partition)
            return [self._build(p, r) for p, r in zip(partitions, reused)]
        probes = cast("Probes | None", ctx.artefacts)
        flags = list(probes.flags) if probes is not None else self.flags()
        checked = probes.compiled if probes is not None else {}
        results: list[CompileResult | None] = [_checked(checked, p) for p in partitions]
        todo = [p for p, r in zip(partitions, results) if r is None]
        for partition, result in zip(partitions, results):
            if result is not None:
                ctx.progress(partition)
        fresh = iter(compile_partitions(todo, flags, ctx.guard, ep_name=self.name, on_done=ctx.progress,
                                        memory_mib=self.config.compile_memory_mb))  # fmt: skip
        done = [r if r is not None else next(fresh) for r in results]
        return [self._build(p, r) for p, r in zip(partitions, done)]

    def _build(self, partition: Partition, result: CompileResult) -> CompiledIREE:
        where = f"{self.name} partition {partition.name!r}"
        if not result.ok:
            from epctx.providers.iree.capability import short_error

            raise EPFail(f"{where}: {short_error(result)}")
        tensors = _parameter_sources(partition)
        weights = []
        transposed: dict[str, tuple[int, ...]] = {}
        for name, key in result.params:
            tensor = tensors.get(name)
            array = initializer_array(tensor) if tensor is not None else None
            perm = result.transposed.get(name)
            if array is not None and perm is not None:  # stored as IREE reads it, not as in the source model
                array = np.ascontiguousarray(array.transpose(perm))
                transposed[key] = perm
            if array is None:
                raise EPFail(
                    f"{where}: IREE made a parameter of {name!r}, which is neither a tensor initializer nor the "
                    "value of a Constant node of the partition"
                )
            weights.append((key, array, tensor))
        refs, sources = self._weightless_refs(weights, where)
        from epctx.providers.iree.refit_record import record

        refit = record(partition, result, tensors)
        hardware = self.hardware()
        why = missing_features(hardware, where)
        runner = None
        if why is None:
            params = Parameters((k, a) for k, a, _ in weights)
            runner = Runner(load_module(result.vmfb, where), params, where, self.config.num_threads)
        return CompiledIREE(
            vmfb=result.vmfb,
            weights=[(k, a) for k, a, _ in weights],
            refs=refs,
            sources=sources,
            refit=refit,
            inputs=[v.name or "" for v in partition.inputs],
            outputs=[v.name or "" for v in partition.outputs],
            hardware=hardware,
            where=where,
            runner=runner,
            unavailable=why or "",
            transposed=transposed,
        )

    def _weightless_refs(
        self, weights: Sequence[tuple[str, Any, Any]], where: str
    ) -> tuple[list[WeightRef | None], tuple[SourceFile, ...]]:
        """Weightless mode: where each weight lies, unchanged, in the source's files (None: it is stored)."""
        if not self.weightless.mode:
            return [], ()
        planner = SourcePlanner(self.weightless, where)
        try:
            refs = [planner.ref(tensor, array) for _, array, tensor in weights]
        finally:
            planner.close()
        kept = sum(r is None for r in refs)
        logger.info(
            "%s: weightless mode %d, %d of %d weights mapped from the source",
            where,
            self.weightless.mode,
            len(refs) - kept,
            len(refs),
        )
        return refs, tuple(planner.files)

    # -- EP context cache -----------------------------------------------------------------------------
    def sdk_version(self) -> str:
        return f"iree-{iree_version()}"

    def hardware(self) -> str:
        return self.target.hardware()

    def compatibility_info(self) -> str:
        c = self.config
        return compatibility.compatibility_info(
            self.target, c.opt_level, c.channels_last, c.compile_flags, c.fast_codegen, c.depthwise_rewrite
        )

    @classmethod
    def options_from_compatibility_info(cls, info: str) -> dict[str, str]:
        return compatibility.options_from_info(info)

    @classmethod
    def validate_compatibility_info(
        cls, info: str, devices: Sequence[HardwareDevice]
    ) -> CompatibilityVerdict:
        return compatibility.validate(info, devices)

    @classmethod
    def device_incompatibility(cls, device: HardwareDevice) -> DeviceIncompatibility:
        return compatibility.device_incompatibility(device)

    def check_context(self, node: EPContextNode, sdk_version: str, hardware: str) -> str | None:
        if sdk_version != self.sdk_version():
            return f"made by IREE {sdk_version!r}, this process runs {self.sdk_version()!r}"
        if not hardware:  # a binary of several targets (a package's): load_partition checks each graph's
            return None
        return missing_features(hardware, f"EPContext node {node.name!r}")

    def save_partition(self, partition: Partition, compiled: CompiledPartition, store: ContextWriter) -> None:
        compiled = cast(CompiledIREE, compiled)  # the framework checks compiled_type
        write_entries(
            store,
            vmfb=compiled.vmfb,
            weights=compiled.weights,
            inputs=compiled.input_names,
            outputs=compiled.output_names,
            hardware=compiled.hardware,
            refs=compiled.refs,
            sources=compiled.sources,
            refit=compiled.refit,
            transposed=compiled.transposed,
        )

    def load_partition(
        self, source: ContextReader, node: EPContextNode, partition: Partition
    ) -> CompiledPartition:
        where = f"{self.name} graph {source.graph_name!r}"
        meta = read_meta(source, where)
        if (len(meta.inputs), len(meta.outputs)) != (len(partition.inputs), len(partition.outputs)):
            raise InvalidGraph(
                f"{where}: the module takes {len(meta.inputs)} inputs and gives {len(meta.outputs)} outputs, "
                f"EPContext node {node.name!r} has {len(partition.inputs)} and {len(partition.outputs)}"
            )
        why = missing_features(meta.hardware, where)
        if why is not None:
            raise InvalidGraph(f"{where}: {why}")
        entries: list[tuple[str, Any]] = [(key, source.read(entry)) for entry, key in meta.params]
        if meta.sources:  # weightless: the source's files mapped (digests checked) and pointed into
            maps = [memoryview(m) for m in open_sources(meta.sources, self.weightless, where)]
            entries += [(key, maps[r.file][r.offset : r.offset + r.length]) for key, r in meta.external]
        parameters = Parameters(entries)
        runner = Runner(load_module(source.read("module"), where), parameters, where, self.config.num_threads)
        return CompiledIREE(
            vmfb=b"",
            weights=(),
            inputs=meta.inputs,
            outputs=meta.outputs,
            hardware=meta.hardware,
            where=where,
            runner=runner,
            transposed=meta.transposed,
        )


def _checked(probes: Checked, partition: Partition) -> CompileResult | None:
    """The capability check's compile of exactly this partition (same nodes, inputs and outputs)."""
    found = probes.get(frozenset(ir_nodes(partition.nodes)))
    if found is None:
        return None
    checked, result = found
    same = [v.name for v in checked.inputs] == [v.name for v in partition.inputs] and [
        v.name for v in checked.outputs
    ] == [v.name for v in partition.outputs]
    return result if same else None
