"""ExampleExecutionProvider: a small compiling EP in pure numpy, the template for EP authors.

- ``get_capability`` claims float32 nodes of a few standard ops (option ``ops`` narrows the list);
- ``compile`` lowers each partition into a :class:`~epctx.providers.example.program.Program` (constant
  folding, pre-transposed / pre-scaled Gemm weights, Identity removed, Reshape shapes resolved) and builds
  a :class:`~epctx.providers.example.interpreter.CompiledProgram` that runs it;
- ``save_partition`` stores the program (JSON) and its weights (raw entries) in the context binary;
  ``load_partition`` parses them back and builds the same callable, without lowering anything.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

from epctx.ep import (
    EPCTX_VERSION,
    Capability,
    CapabilityContext,
    CompatibilityVerdict,
    CompileContext,
    CompiledPartition,
    ExecutionProvider,
    Option,
    OrtCompiledModelCompatibility,
    Partition,
    parse_info,
    parse_options,
)
from epctx.providers.example.interpreter import CompiledProgram
from epctx.providers.example.ops import SUPPORTED_OPS
from epctx.providers.example.program import PROGRAM_VERSION, WEIGHT_DTYPES, Program

if TYPE_CHECKING:
    import onnx_ir as ir

    from epctx.ep import ContextReader, ContextWriter, EPContextNode, HardwareDevice

__all__ = ["SUPPORTED_OPS", "ExampleExecutionProvider"]

OPTIONS = (
    Option("ops", "list", default=frozenset(), choices=SUPPORTED_OPS, doc="op types to claim (default: all)"),
)


@dataclasses.dataclass(frozen=True, slots=True)
class ExampleOptions:
    ops: frozenset[str]


_SDK_PREFIX = "example-"
_PROGRAM_TAG = "/program-"


class ExampleExecutionProvider(ExecutionProvider):
    name = "ExampleExecutionProvider"
    compiles = True
    compiled_type = CompiledProgram

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        config = parse_options(self.name, self.options, OPTIONS, into=ExampleOptions)
        self.ops = config.ops or frozenset(SUPPORTED_OPS)

    # -- capability -----------------------------------------------------------------------------------
    def get_capability(
        self, graph: ir.Graph, opset_imports: Mapping[str, int], ctx: CapabilityContext
    ) -> Capability:
        from epctx.providers.example.capability import supported_nodes

        return Capability(tuple(supported_nodes(graph, opset_imports, self.ops)))

    # -- compile --------------------------------------------------------------------------------------
    def compile(self, partitions: Sequence[Partition], ctx: CompileContext) -> list[CompiledPartition]:
        from epctx.providers.example.lowering import lower_partition

        compiled: list[CompiledPartition] = []
        for partition in partitions:
            compiled.append(lower_partition(partition))
            ctx.progress(partition)
        return compiled

    # -- EP context cache -----------------------------------------------------------------------------
    def sdk_version(self) -> str:
        return f"{_SDK_PREFIX}{EPCTX_VERSION}{_PROGRAM_TAG}{PROGRAM_VERSION}"

    def check_context(self, node: EPContextNode, sdk_version: str, hardware: str) -> str | None:
        verdict = _verdict(self.name, sdk_version, hardware)
        usable = verdict.status <= OrtCompiledModelCompatibility.EP_SUPPORTED_OPTIMAL
        return None if usable else "; ".join(verdict.reasons)

    @classmethod
    def validate_compatibility_info(
        cls, info: str, devices: Sequence[HardwareDevice]
    ) -> CompatibilityVerdict:
        fields = parse_info(info)
        return _verdict(cls.name, fields.get("sdk", ""), fields.get("hardware", ""))

    def save_partition(self, partition: Partition, compiled: CompiledPartition, store: ContextWriter) -> None:
        compiled = cast(CompiledProgram, compiled)  # the framework checks compiled_type
        store.add("program", compiled.program.to_json(), kind="graph")
        for j, (weight, spec) in enumerate(zip(compiled.weights, compiled.program.weights)):
            data = np.ascontiguousarray(weight, dtype=WEIGHT_DTYPES[spec.dtype])
            attrs = {"dtype": spec.dtype, "shape": json.dumps(list(spec.shape))}
            store.add(f"weights/{j}", data, kind="weights", attrs=attrs)

    def load_partition(
        self, source: ContextReader, node: EPContextNode, partition: Partition
    ) -> CompiledPartition:
        where = f"{self.name} graph {source.graph_name!r}"
        program = Program.from_json(source.read("program"), where=where)
        weights = [
            source.array(f"weights/{j}", WEIGHT_DTYPES[spec.dtype], spec.shape)
            for j, spec in enumerate(program.weights)
        ]
        return CompiledProgram(program, weights, where=where)


def _verdict(ep_name: str, sdk_version: str, hardware: str) -> CompatibilityVerdict:
    """Binaries hold a program, not machine code: any epctx that reads the same program version loads them, on
    any device."""
    head, tag, version = sdk_version.rpartition(_PROGRAM_TAG)
    if not tag or not head.startswith(_SDK_PREFIX):
        return CompatibilityVerdict.unsupported(
            f"SDK version {sdk_version!r} is not an example EP program version"
        )
    if version != str(PROGRAM_VERSION):
        return CompatibilityVerdict.unsupported(
            f"program format {version!r}, this {ep_name} runs format {PROGRAM_VERSION}",
            advice="recompile the context from its source model with this epctx",
        )
    if hardware:
        return CompatibilityVerdict.unsupported(
            f"hardware {hardware!r}, this {ep_name} makes portable binaries ('')"
        )
    made_by = head.removeprefix(_SDK_PREFIX)
    if made_by != EPCTX_VERSION:
        return CompatibilityVerdict.optimal(
            f"made by epctx {made_by}, this is {EPCTX_VERSION}: the program format {version} is the same"
        )
    return CompatibilityVerdict.optimal()
