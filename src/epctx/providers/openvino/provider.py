"""OpenVINOExecutionProvider: partitions compiled by OpenVINO, context binaries through export / import.

- ``get_capability`` asks OpenVINO (ONNX frontend + ``Core.query_model``) which nodes it runs;
- ``compile`` extracts each partition as an ONNX model whose weights OpenVINO reads in place, reads it with
  ``Core.read_model`` and compiles it with ``Core.compile_model``;
- ``save_partition`` stores ``CompiledModel.export_model()`` (plus, in weightless mode, the weights apart)
  and ``load_partition`` imports it with ``Core.import_model`` from the binary's memory, never compiling.

Importing ``epctx`` does not import OpenVINO; this module does, when the EP is selected. Loading a context
model uses OpenVINO's runtime only (the ONNX frontend is not asked: a graph that holds this EP's EPContext
nodes was partitioned when it was generated, so its other nodes are not offered to OpenVINO again).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from epctx.ep import (
    BinaryLayout,
    Capability,
    CapabilityContext,
    CompileContext,
    CompiledPartition,
    EPContextNode,
    ExecutionProvider,
    Partition,
    is_ep_context,
    open_source_fd,
)
from epctx.errors import EPFail, InvalidArgument, InvalidGraph
from epctx.providers.openvino import compatibility
from epctx.providers.openvino.compiled import CompiledOpenVINO
from epctx.providers.openvino.context import exported_blob, read_meta, shared_tensor, write_entries
from epctx.providers.openvino.options import OpenVINOOptions, parse_options
from epctx.providers.openvino.weights import WeightsLayout, header_budget, layout_for, weights_file

if TYPE_CHECKING:
    import onnx_ir as ir

    # Loading a context model imports only what import_model needs: the capability and ONNX-bridge modules (onnx,
    # onnx-ir, OpenVINO's ONNX frontend) are imported by get_capability / compile.
    from epctx.ep import CompatibilityVerdict, ContextReader, ContextWriter, HardwareDevice, WeightsFile

__all__ = ["OpenVINOExecutionProvider", "shared_core"]

_CORE: Any = None
_CORE_LOCK = threading.Lock()
logger = logging.getLogger("epctx")


def shared_core() -> Any:
    """One ``ov.Core`` per process (thread-safe; plugins load once)."""
    global _CORE
    if _CORE is None:
        with _CORE_LOCK:
            if _CORE is None:
                from epctx.ep import backend_import

                with backend_import("openvino"):  # its telemetry forks: see epctx/ep/_blas.py
                    import openvino as ov

                _CORE = ov.Core()
    return _CORE


@functools.cache
def device_hardware(device: str) -> str:
    """The hardware string of ``device``, queried once per process (device queries cost milliseconds)."""
    parts = [device]
    for key in ("DEVICE_ARCHITECTURE", "FULL_DEVICE_NAME", "OPTIMIZATION_CAPABILITIES"):
        try:
            value = shared_core().get_property(device, key)
        except RuntimeError:
            value = ""
        parts.append(",".join(value) if isinstance(value, (list, tuple)) else str(value))
    return "/".join(parts)


class OpenVINOExecutionProvider(ExecutionProvider):
    name = "OpenVINOExecutionProvider"
    compiles = True
    # onnxruntime's weightless modes: EXTERNAL_ONLY (source_weights.py); its own option weightless=1 keeps the
    # weights in the binary instead
    weightless_supported_modes = "external_only"
    compiled_type = CompiledOpenVINO
    intra_op_threads_option = "num_of_threads"  # INFERENCE_NUM_THREADS
    # OpenVINO's CPU plugin runs a model compiled for static shapes clearly faster than the same model with
    # dynamic dimensions (shape inference and memory planning at every call): the corpus at one thread, dynamic
    # against static, as ratios to onnxruntime: the tiny LLM's prefill 1.29 -> 0.69 and decode step 1.23 -> 1.05,
    # PP-OCRv4 det 0.67 -> 0.54 and cls 0.84 -> 0.64, magika 1.02 -> 0.87, MobileNetV3 1.07 -> 0.93, none slower
    # (benchmarks/results/corpus_openvino_static_threads1_stop28.txt). So its sessions specialize per shape
    # (epctx.specialize_shapes), as onnxruntime's OpenVINO EP compiles per shape with disable_dynamic_shapes.
    static_shapes_help = True

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self.config: OpenVINOOptions = parse_options(self.options)
        self.core = shared_core()
        if self.config.device != "CPU":
            available = list(self.core.available_devices)
            if self.config.device not in available and self.config.device.split(".")[0] not in available:
                raise EPFail(
                    f"{self.name}: device_type {self.config.device!r} is not available here "
                    f"(OpenVINO reports {available})"
                )
        self._hardware: str | None = None
        # Weightless mode: where the weights start and their layout, fixed at compile for save_partition.
        self._layout: WeightsLayout | None = None
        self._weights_base: int | None = None

    # -- capability -----------------------------------------------------------------------------------
    def get_capability(
        self, graph: ir.Graph, opset_imports: Mapping[str, int], ctx: CapabilityContext
    ) -> Capability:
        """The nodes OpenVINO runs; every other node offered (EPContext nodes aside) declined with OpenVINO's
        reason: the frontend's conversion report, the device's ``query_model``, or an untyped value /
        ``disabled_ops``."""
        if any(is_ep_context(n) and self._owns(n) for n in graph):
            # A context model: its other nodes were offered to OpenVINO when it was generated.
            return Capability()
        from epctx.providers.openvino.capability import candidate_nodes, supported_nodes

        candidates, declined = candidate_nodes(graph, self.config.disabled_ops)
        try:
            claimed, refused = supported_nodes(
                self.core, self.config.device, self.config.runtime_config(), graph, opset_imports, candidates
            )
        except RuntimeError as exc:  # the frontend or the device refused the model as a whole
            raise EPFail(f"{self.name}: OpenVINO could not query the model: {exc}") from exc
        declined.update(refused)
        # The artefact: a bound on the binary entries this session may write (weightless mode sizes the
        # binary's header room with it): one weights entry per initializer, a meta and a blob per partition.
        return Capability(tuple(claimed), declined, artefacts=len(graph.initializers) + 2 * len(claimed))

    def _owns(self, node: ir.Node) -> bool:
        attr = node.attributes.get("source")
        value = getattr(attr, "value", None)
        return isinstance(value, str) and self.accepts_source(value)

    # -- compile --------------------------------------------------------------------------------------
    def compile(self, partitions: Sequence[Partition], ctx: CompileContext) -> list[CompiledPartition]:
        if self.config.weightless and self._weights_base is None:
            bound = ctx.artefacts if isinstance(ctx.artefacts, int) else 0
            self._weights_base = header_budget(bound or sum(len(p.initializers) + 2 for p in partitions))
        target = ctx.target_binary() if self.config.weightless else None
        compiled: list[CompiledPartition] = []
        for partition in partitions:
            compiled.append(self._compile(partition, target))
            ctx.progress(partition)
        return compiled

    def _compile(self, partition: Partition, target: BinaryLayout | None) -> CompiledOpenVINO:
        from epctx.providers.openvino.onnx_bridge import read_partition

        where = f"{self.name} partition {partition.name!r}"
        inputs = [v.name or "" for v in partition.inputs]
        outputs = [v.name or "" for v in partition.outputs]
        config = self.config.compile_config()
        if self.weightless.mode:  # onnxruntime's EXTERNAL_ONLY: the blob references the source's data file
            return self._compile_external_only(partition, inputs, outputs, where)
        if self.config.weightless:
            plan = self._compile_layout(partition, target).plan(partition)
            compiled = self._compile_weightless(partition, plan, where)
            return CompiledOpenVINO(compiled, inputs, outputs, where=where, weights=plan)
        try:
            model, keep = read_partition(self.core, partition)
            compiled = self.core.compile_model(model, self.config.device, config)
        except RuntimeError as exc:
            raise EPFail(f"{where}: OpenVINO failed to compile it: {exc}") from exc
        return CompiledOpenVINO(compiled, inputs, outputs, where=where, keep_alive=keep)

    def _compile_external_only(
        self, partition: Partition, inputs: list[str], outputs: list[str], where: str
    ) -> CompiledOpenVINO:
        from epctx.providers.openvino.onnx_bridge import read_partition
        from epctx.providers.openvino.source_weights import source_model_folder, source_refs

        if self.config.weightless:
            raise InvalidArgument(
                f"{self.name}: the provider option weightless=1 (weights in the binary) and "
                "ep.enable_weightless_mode (weights in the source's data file) exclude each other: give one"
            )
        found = source_refs(partition, where)
        config = {**self.config.compile_config(), "CACHE_MODE": "OPTIMIZE_SIZE"}
        try:
            if found is None:  # nothing outside the .onnx: the blob holds every weight
                model, keep = read_partition(self.core, partition)
                return CompiledOpenVINO(
                    self.core.compile_model(model, self.config.device, config), inputs, outputs,
                    where=where, keep_alive=keep,
                )  # fmt: skip
            source, data, refs = found
            with source_model_folder(partition, refs, data) as path:
                compiled_model = self.core.compile_model(
                    self.core.read_model(path), self.config.device, config
                )
        except RuntimeError as exc:
            raise EPFail(f"{where}: OpenVINO failed to compile it: {exc}") from exc
        compiled = CompiledOpenVINO(compiled_model, inputs, outputs, where=where)
        compiled.source_file = source
        return compiled

    def _compile_weightless(self, partition: Partition, plan: WeightsFile, where: str) -> Any:
        from epctx.providers.openvino.onnx_bridge import weightless_model_folder

        try:
            with weightless_model_folder(partition, plan) as path:
                model = self.core.read_model(path)
                return self.core.compile_model(model, self.config.device, self.config.compile_config())
        except RuntimeError as exc:
            raise EPFail(f"{where}: OpenVINO failed to compile it: {exc}") from exc

    def _base(self, partition: Partition) -> int:
        """Where this session's weights start in a binary it opens (fixed at the first weightless compile)."""
        if self._weights_base is None:
            self._weights_base = header_budget(len(partition.initializers) + 2)
        return self._weights_base

    def _compile_layout(self, partition: Partition, target: BinaryLayout | None) -> WeightsLayout:
        """Where this session's weights go. In a sharing group whose binary already has entries (an earlier
        model), the group's layout: offsets past the earlier models' weights, identical tensors at theirs.
        Otherwise this EP's own, from the header budget; ``save_partition`` checks the offsets against the
        binary it is given either way."""
        if target is not None and target.entry_count():
            return layout_for(target, self._base(partition))
        if self._layout is None:
            self._layout = WeightsLayout(self._base(partition))
        return self._layout

    # -- EP context cache -----------------------------------------------------------------------------
    def sdk_version(self) -> str:
        import openvino as ov

        return f"openvino-{ov.get_version()}"

    def hardware(self) -> str:
        """Device, architecture, full name and capabilities, e.g. ``CPU/intel64/<name>/BF16,FP32,...``."""
        if self._hardware is None:
            self._hardware = device_hardware(self.config.device)
        return self._hardware

    def compatibility_info(self) -> str:
        c = self.config
        return compatibility.compatibility_info(
            self.sdk_version(), c.device, self.hardware(), c.precision, c.weightless
        )

    @classmethod
    def validate_compatibility_info(
        cls, info: str, devices: Sequence[HardwareDevice]
    ) -> CompatibilityVerdict:
        return compatibility.validate(info, devices)

    def check_context(self, node: EPContextNode, sdk_version: str, hardware: str) -> str | None:
        if sdk_version != self.sdk_version():
            return f"made by OpenVINO {sdk_version!r}, this process runs {self.sdk_version()!r}"
        if hardware != self.hardware():
            return f"compiled for {hardware!r}, this device is {self.hardware()!r}"
        return None

    def save_partition(self, partition: Partition, compiled: CompiledPartition, store: ContextWriter) -> None:
        compiled = cast(CompiledOpenVINO, compiled)  # the framework checks compiled_type
        if compiled.weights is not None:
            self._place_weights(partition, compiled, store)
        blob = exported_blob(compiled.compiled_model)
        write_entries(
            store,
            blob=blob,
            device=self.config.device,
            config=self.config.runtime_config(),
            inputs=compiled.input_names,
            outputs=compiled.output_names,
            weights=compiled.weights,
            source=compiled.source_file,
        )

    def _place_weights(self, partition: Partition, compiled: CompiledOpenVINO, store: ContextWriter) -> None:
        """Make the blob reference the offsets its weights will have in ``store``'s binary. The layout of that
        binary (shared by a sharing group's models) gives them; when the partition was compiled against
        another layout (a sharing group this EP could not see at compile time, partitions saved out of
        order), it is compiled again against this one, so the blob never references offsets that another
        model's weights hold (which would make its weights copied at every load)."""
        plan = layout_for(store.writer, self._base(partition)).replan(compiled.weights)
        if plan.refs == compiled.weights.refs:
            return
        logger.info(
            "%s partition %r: its weights go elsewhere in the shared binary than at compile time; compiling it "
            "again against the binary's layout so that they load in place", self.name, partition.name,
        )  # fmt: skip
        compiled.release()  # before compiling again: one compiled copy of the weights at a time
        compiled.rebind(self._compile_weightless(partition, plan, compiled.where), weights=plan)

    def load_partition(
        self, source: ContextReader, node: EPContextNode, partition: Partition
    ) -> CompiledPartition:
        where = f"{self.name} graph {source.graph_name!r}"
        meta = read_meta(source.read("meta"), where)
        if meta.device != self.config.device:
            raise InvalidGraph(
                f"{where}: compiled for device {meta.device!r}, this EP runs on {self.config.device!r}"
            )
        view = source.read("blob")
        tensor, array = shared_tensor(view)
        # The precision the blob was compiled with; streams / threads given to this EP override the recorded ones.
        config = dict(meta.config)
        config.update(
            (k, v) for k, v in self.config.runtime_config().items() if k != "INFERENCE_PRECISION_HINT"
        )
        if meta.source is not None:  # EXTERNAL_ONLY: the source's data file, checked, mapped by OpenVINO
            config["CACHE_MODE"] = "OPTIMIZE_SIZE"
            fd = open_source_fd(meta.source, self.weightless, where)
            try:
                config["WEIGHTS_PATH"] = f"/proc/self/fd/{fd}"
                compiled = self.core.import_model(tensor, meta.device, config)
            finally:
                os.close(fd)
        elif meta.weights:
            config["CACHE_MODE"] = "OPTIMIZE_SIZE"
            with weights_file(source, meta) as path:
                config["WEIGHTS_PATH"] = path
                compiled = self.core.import_model(tensor, meta.device, config)
        else:
            compiled = self.core.import_model(tensor, meta.device, config)
        return CompiledOpenVINO(
            compiled, meta.inputs, meta.outputs, where=where, keep_alive=(view, array, tensor)
        )
