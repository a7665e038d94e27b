"""The EP API: what an execution provider implements to take part in a session.

An EP is asked, in precedence order, which nodes of the graph it supports (``get_capability``, returning a
``Capability`` value). The framework groups the nodes it wins into cycle-free partitions. A *compiling* EP
turns all its partitions into ``CompiledPartition`` objects in one ``compile`` call, given a ``CompileContext``
(the capability's artefacts, the target binary, progress, the guard); a *kernel* EP (the CPU EP) builds one
kernel per node instead. The EP keeps no state between the stages: values in, values out.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from epctx import errors
from epctx.ep._partition import Partition
from epctx.ep._weightless import NO_WEIGHTLESS, WeightlessSetting

if TYPE_CHECKING:
    import numpy as np
    import onnx_ir as ir

    from epctx.ep._compatibility import CompatibilityVerdict, DeviceIncompatibility
    from epctx.ep._compiling import Capability, CapabilityContext, CompileContext
    from epctx.ep._context_io import ContextReader, ContextWriter
    from epctx.ep._context_node import EPContextNode
    from epctx.ep._payloads import PayloadInfo

__all__ = [
    "CompiledPartition",
    "ExecutionProvider",
    "Kernel",
    "NodeContext",
    "Partition",
    "SubgraphRunner",
    "make_partition",
    "opset_of",
]

# A kernel is called with the node's inputs (None for an omitted optional input) followed by the values of
# the outer scope its subgraphs read, and returns one value per node output.
Kernel = Callable[..., Sequence[Any]]


class SubgraphRunner(Protocol):
    """A control-flow body built once: ``run(inputs, outer)`` -> the subgraph's outputs."""

    def __call__(self, inputs: Sequence[Any], outer: Sequence[Any]) -> list[Any]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class NodeContext:
    """Everything a kernel EP needs to build the kernel of one node."""

    node: ir.Node
    opset: int
    # Values of enclosing graphs that the node's subgraphs read; passed after the node's own inputs.
    outer_values: tuple[ir.Value, ...] = ()
    # Builds a runner for one subgraph attribute; the runner receives ``outer_values`` at call time.
    build_subgraph: Callable[[ir.Graph, tuple[ir.Value, ...]], SubgraphRunner] | None = None


class CompiledPartition(Protocol):
    """A compiled partition: called on the hot path with numpy arrays, one per ``Partition.inputs``."""

    def __call__(self, *inputs: np.ndarray) -> Sequence[np.ndarray]: ...


class ExecutionProvider(abc.ABC):
    """Base of every EP. Subclasses set ``name`` and implement ``get_capability`` plus either
    ``compile`` (compiling EPs, ``compiles = True``) or ``create_kernel`` (kernel EPs).

    A compiling EP that supports the EP context cache also implements ``save_partition`` (put what
    ``load_partition`` needs into the context binary) and ``load_partition`` (rebuild a compiled partition
    from it, without compiling). The framework owns the files: it names and writes the context model and the
    binary, embeds it or not, resolves paths, verifies checksums and the SDK version / hardware recorded in
    the binary against ``sdk_version()`` / ``hardware()`` before ``load_partition`` is called."""

    name: ClassVar[str]
    # EPContext ``source`` keys this EP accepts (compared case-insensitively); defaults to ``(name,)``.
    sources: ClassVar[tuple[str, ...]] = ()
    compiles: ClassVar[bool] = False
    # The type(s) of the compiled partitions this EP saves: the framework refuses to save anything else.
    compiled_type: ClassVar[type | tuple[type, ...] | None] = None
    # The provider option through which the framework passes ``SessionOptions.intra_op_num_threads`` (when it
    # is > 0 and the user did not set that option): the CPU EP's BLAS limit, OpenVINO's ``num_of_threads``
    # (INFERENCE_NUM_THREADS), IREE's task topology. None: the EP takes no thread count.
    intra_op_threads_option: ClassVar[str | None] = None
    # Weightless modes this EP covers (onnxruntime's ``weightless_supported_modes``: "none", "external_only",
    # "all", "all_or_external_only"); its devices report the same. The framework refuses a mode not covered
    # before compiling, and sets ``weightless`` (the mode asked for, and where the source's files are).
    weightless_supported_modes: ClassVar[str] = "none"
    weightless: WeightlessSetting = NO_WEIGHTLESS
    # True: a compiled partition's code does not depend on its weights, so a context can be refit to a model
    # with the same graph and other weights (``epctx.refit_context``, ``epctx refit``) without compiling.
    refits: ClassVar[bool] = False
    # The partition stage's cost rule (``epctx.partition.cost``) for a compiling EP: a partition that is not the
    # whole graph, holds no heavy op (convolution, matrix product, recurrence, attention) and has fewer nodes
    # than this is left to the next EP (crossing its boundaries costs more than compiling it saves). 0: no rule.
    min_partition_nodes: ClassVar[int] = 0
    # True: code this compiling EP makes for static input shapes runs clearly faster than its code for dynamic
    # dimensions (IREE, OpenVINO). A session over a model with dynamic input dimensions whose providers hold such
    # an EP then specializes per input-shape signature (``epctx.specialize_shapes``, ``epctx.session.specialize``):
    # a signature seen twice gets a session of its own compiled for those shapes (within
    # ``epctx.specialize_shapes_max`` and ``epctx.specialize_shapes_max_mb``). False (the default): the EP runs
    # dynamic shapes about as fast, and nothing is specialized for it.
    static_shapes_help: ClassVar[bool] = False

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        self.options: dict[str, str] = {k: str(v) for k, v in (options or {}).items()}

    @abc.abstractmethod
    def get_capability(
        self, graph: ir.Graph, opset_imports: Mapping[str, int], ctx: CapabilityContext
    ) -> Capability:
        """The nodes of ``graph`` this EP runs, those it declines with the reason (e.g. its backend failed to
        compile them), and what its checks produced that ``compile`` may reuse. Must not modify the graph; a
        check that compiles calls ``ctx.guard.check`` before it starts a compiler."""

    def compile(self, partitions: Sequence[Partition], ctx: CompileContext) -> list[CompiledPartition]:
        """All the partitions of this EP in the session, compiled in one call (in parallel where the backend
        can), one result each in order; ``ctx.progress(partition)`` as each is done."""
        raise NotImplementedError(f"{self.name} does not compile partitions")

    def create_kernel(self, ctx: NodeContext) -> Kernel:
        raise NotImplementedError(f"{self.name} does not create per-node kernels")

    def provider_options(self) -> dict[str, str]:
        return dict(self.options)

    def run_scope(self) -> contextlib.AbstractContextManager[Any] | None:
        """A context the session enters around each run (a thread limit, a device lock); None: nothing (the
        default, and then run() pays nothing for it)."""
        return None

    # -- EP context cache ------------------------------------------------------------------------------
    def sdk_version(self) -> str:
        """Version of the backend that produced / can load binaries (``ep_sdk_version``)."""
        return ""

    def hardware(self) -> str:
        """The target the binaries are built for (``hardware_architecture``); "" when portable."""
        return ""

    def compatibility_info(self) -> str:
        """Written at compile as model metadata ``ep_compatibility_info.<name>`` (onnxruntime's
        ``GetCompiledModelCompatibilityInfo``): what :meth:`validate_compatibility_info` needs to judge the
        binaries later (SDK version, target, the options that change the code)."""
        return f"sdk={self.sdk_version()};hardware={self.hardware()}"

    @classmethod
    def options_from_compatibility_info(cls, info: str) -> dict[str, str]:
        """The provider options a context was compiled with, as far as its compatibility string tells them
        (a refit compiles nothing, and must record the same string): {} by default."""
        return {}

    @classmethod
    def validate_compatibility_info(cls, info: str, devices: Sequence[Any]) -> CompatibilityVerdict:
        """Optional: judge a string written by :meth:`compatibility_info` against ``devices`` (empty: the
        device this process would run it on), from the string alone: no backend import, no payload read
        (onnxruntime's ``ValidateCompiledModelCompatibilityInfo``; ``devices``: ``epctx.ep.HardwareDevice``). The default knows nothing:
        ``EP_NOT_APPLICABLE``, as in onnxruntime."""
        from epctx.ep._compatibility import CompatibilityVerdict

        return CompatibilityVerdict.not_applicable(f"{cls.name} does not judge compatibility strings")

    @classmethod
    def device_incompatibility(cls, device: Any) -> DeviceIncompatibility:
        """Optional: why this EP cannot use ``device`` (onnxruntime's
        ``GetHardwareDeviceIncompatibilityDetails``); the default reports no known incompatibility."""
        from epctx.ep._compatibility import DeviceIncompatibility

        return DeviceIncompatibility()

    def check_context(self, node: EPContextNode, sdk_version: str, hardware: str) -> str | None:
        """Why a binary made with ``sdk_version`` for ``hardware`` cannot load here (None: it can).
        The default requires both to equal this EP's; EPs with compatible version ranges override it."""
        if sdk_version != self.sdk_version():
            return f"SDK version: binary {sdk_version!r}, this {self.name} {self.sdk_version()!r}"
        if hardware != self.hardware():
            return f"hardware: binary {hardware!r}, this {self.name} {self.hardware()!r}"
        return None

    def save_partition(self, partition: Partition, compiled: CompiledPartition, store: ContextWriter) -> None:
        """Store what ``load_partition`` needs for ``partition`` (entries under ``store.graph_name``)."""
        raise errors.NotImplemented(f"{self.name} cannot write EP context binaries")

    def load_partition(
        self, source: ContextReader, node: EPContextNode, partition: Partition
    ) -> CompiledPartition:
        """Rebuild a compiled partition from the context binary; must not compile.
        ``partition`` describes the EPContext node's inputs and outputs in the model."""
        raise errors.NotImplemented(f"{self.name} cannot load EP context binaries")

    @classmethod
    def accepts_source(cls, source: str) -> bool:
        keys = cls.sources or (cls.name,)
        return source.lower() in {k.lower() for k in keys}

    @classmethod
    def detect_payload(cls, data: memoryview) -> PayloadInfo | None:
        """Optional: recognise a context payload this EP's backend writes outside epctx's container (those of
        the matching onnxruntime EP), from its bytes only (``epctx inspect``; see :mod:`epctx.ep._payloads`)."""
        return None


def opset_of(node: ir.Node, opset_imports: Mapping[str, int]) -> int:
    """The opset version that applies to ``node`` (its domain's import in the model)."""
    domain = node.domain or ""
    if node.version is not None:
        return node.version
    if domain in opset_imports:
        return opset_imports[domain]
    if domain == "ai.onnx" and "" in opset_imports:
        return opset_imports[""]
    return 1


def make_partition(
    name: str, ep_name: str, graph: ir.Graph, members: list[ir.Node], opset_imports: Mapping[str, int]
) -> Partition:
    """Describe a fused group: the values it reads from outside and the values it must expose."""
    from epctx.model.scopes import node_subgraphs, outer_scope_values

    # Nodes of the members' subgraphs count as inside: a value read only there is not an output.
    inside = set(members)
    for node in members:
        for sub in node_subgraphs(node):
            inside.update(sub.all_nodes())
    produced = {v for n in members for v in n.outputs}
    inputs: dict[ir.Value, None] = {}
    initializers: dict[ir.Value, None] = {}
    for node in members:
        for value in (*node.inputs, *outer_scope_values(node)):
            if value is None or value in produced:
                continue
            if value.const_value is not None and not value.is_graph_input():
                initializers.setdefault(value, None)
            else:
                inputs.setdefault(value, None)
    graph_outputs = set(graph.outputs)
    outputs = [
        v
        for n in members
        for v in n.outputs
        if v in graph_outputs or any(consumer not in inside for consumer, _ in v.uses())
    ]
    return Partition(
        name=name,
        ep_name=ep_name,
        nodes=tuple(members),
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        initializers=tuple(initializers),
        opset_imports=dict(opset_imports),
    )
