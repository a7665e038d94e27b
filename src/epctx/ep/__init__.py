"""``epctx.ep``: everything an EP author imports, and nothing else is needed.

An execution provider implements :class:`ExecutionProvider` (capability, then compile or per-node kernels, and
for the EP context cache ``save_partition`` / ``load_partition``) against the values the framework hands it:
a :class:`CapabilityContext` (returning a :class:`Capability`: the nodes it claims, or its own node groups, one
partition each, which ``fused_groups`` helps it form), a :class:`Partition` of the graph and a
:class:`CompileContext` to compile with, a :class:`ContextWriter` to save into, a :class:`ContextReader` to load
from, and the :class:`EPContextNode` being loaded. Everything else (partitioning, files, names, checksums,
identities, sharing, devices) is the framework's.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from epctx._version import __version__ as EPCTX_VERSION
from epctx.ep._alignment import align, same_bytes
from epctx.ep._compatibility import (
    CompatibilityVerdict,
    DeviceIncompatibility,
    OrtCompiledModelCompatibility,
    OrtDeviceEpIncompatibilityReason,
    format_info,
    installed_version,
    parse_info,
    parse_own_info,
)
from epctx.ep._compiling import Capability, CapabilityContext, CompileContext, CompileGuard
from epctx.ep._context_io import (
    BinaryFile,
    BinaryLayout,
    ContextReader,
    ContextWriter,
    EntryLocation,
)
from epctx.ep._context_node import DOMAIN, OP_TYPE, OPSET_VERSION, EPContextNode, is_ep_context
from epctx.ep._contract import (
    CompiledPartition,
    ExecutionProvider,
    Kernel,
    NodeContext,
    Partition,
    SubgraphRunner,
    make_partition,
    opset_of,
)
from epctx.ep._devices import (
    ALLOW_VIRTUAL_DEVICES,
    VIRTUAL_METADATA_KEY,
    EpDevice,
    EpFactory,
    ExecutionProviderDevicePolicy,
    HardwareDevice,
    HardwareDeviceType,
    device_options,
)
from epctx.ep._documents import dump_document, load_document
from epctx.ep._files import RecordCache, user_cache_dir, write_file_atomic
from epctx.ep._hardware import cpu_device
from epctx.ep._memory import byte_view, mapped_file, release_pages
from epctx.ep._options import RESERVED_OPTION_PREFIX, Option, parse_options
from epctx.ep._partition import ir_nodes, ir_values
from epctx.ep._weightless import (
    NO_WEIGHTLESS,
    SUPPORTED_MODES_KEY,
    WEIGHTLESS_SUPPORT_KEY,
    SourceFile,
    SourcePlanner,
    WeightlessMode,
    WeightlessSetting,
    WeightRef,
    file_digest,
    open_source_fd,
    open_sources,
    setting_for,
)

if TYPE_CHECKING:
    from epctx.ep._blas import backend_import
    from epctx.ep._blas import settle as settle_backends
    from epctx.ep._blas import thread_limit as blas_thread_limit
    from epctx.ep._factory import EP_API_VERSION, PluginEpFactory
    from epctx.ep._grouping import fused_groups
    from epctx.ep._onnx_export import partition_model
    from epctx.model.scopes import node_subgraphs, outer_scope_values
    from epctx.model.tensors import to_numpy
    from epctx.model.view import AttrView, DimView, GraphView, ModelView, NodeView, ShapeView, ValueView

# Imported on first use: the ONNX export helper (onnx), the graph helpers (onnx-ir), and what only compiling
# or inspecting needs, so an EP that loads context binaries imports none of it.
_LAZY = {
    **{name: "epctx.ep._payloads" for name in ("PayloadDetector", "PayloadEntry", "PayloadInfo")},
    **{
        name: "epctx.ep._weights_file"
        for name in ("ExternalRef", "WeightsFile", "initializer_array", "plan_weights_file")
    },
    "partition_model": "epctx.ep._onnx_export",
    "fused_groups": "epctx.ep._grouping",
    # the API's version and the base of a plugin library's factory (registration only)
    **{name: "epctx.ep._factory" for name in ("EP_API_VERSION", "PluginEpFactory")},
    "node_subgraphs": "epctx.model.scopes",
    "outer_scope_values": "epctx.model.scopes",
    "to_numpy": "epctx.model.tensors",
    # the model view both load paths give (typing only: epctx/model/view.py)
    **{
        name: "epctx.model.view"
        for name in ("AttrView", "DimView", "GraphView", "ModelView", "NodeView", "ShapeView", "ValueView")
    },
    # numpy's BLAS versus backends that fork at import (epctx/ep/_blas.py)
    "backend_import": "epctx.ep._blas",
    "settle_backends": "epctx.ep._blas",
    "blas_thread_limit": "epctx.ep._blas",
}
_RENAMED = {"settle_backends": "settle", "blas_thread_limit": "thread_limit"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'epctx.ep' has no attribute {name!r}")
    return getattr(importlib.import_module(module), _RENAMED.get(name, name))


__all__ = [
    # the contract
    "ExecutionProvider",
    "Capability",
    "CapabilityContext",
    "CompileContext",
    "CompileGuard",
    "Partition",
    "CompiledPartition",
    "Kernel",
    "NodeContext",
    "SubgraphRunner",
    "make_partition",
    "fused_groups",
    "opset_of",
    "ir_nodes",
    "ir_values",
    # the model view: what a Partition holds on either load path
    "ValueView",
    "NodeView",
    "AttrView",
    "GraphView",
    "ModelView",
    "ShapeView",
    "DimView",
    "outer_scope_values",
    "node_subgraphs",
    # provider options
    "Option",
    "parse_options",
    "RESERVED_OPTION_PREFIX",
    # devices and plugin libraries
    "EP_API_VERSION",
    "PluginEpFactory",
    "device_options",
    "EpFactory",
    "EpDevice",
    "HardwareDevice",
    "cpu_device",
    "HardwareDeviceType",
    "ExecutionProviderDevicePolicy",
    "VIRTUAL_METADATA_KEY",
    # weightless contexts (onnxruntime's modes; weights mapped from the source's files, bound by digest)
    "WeightlessMode",
    "WeightlessSetting",
    "NO_WEIGHTLESS",
    "SUPPORTED_MODES_KEY",
    "WEIGHTLESS_SUPPORT_KEY",
    "SourceFile",
    "SourcePlanner",
    "WeightRef",
    "file_digest",
    "open_source_fd",
    "open_sources",
    "setting_for",
    # compatibility verdicts (onnxruntime's names)
    "CompatibilityVerdict",
    "DeviceIncompatibility",
    "OrtCompiledModelCompatibility",
    "OrtDeviceEpIncompatibilityReason",
    "format_info",
    "parse_info",
    "parse_own_info",
    "installed_version",
    "ALLOW_VIRTUAL_DEVICES",
    # backends and numpy's BLAS
    "backend_import",
    "settle_backends",
    "blas_thread_limit",
    "EPCTX_VERSION",
    # files: written atomically; what an EP keeps between processes in the user's cache
    "write_file_atomic",
    "user_cache_dir",
    "RecordCache",
    # recognising an EP's own context payloads (epctx inspect)
    "PayloadInfo",
    "PayloadEntry",
    "PayloadDetector",
    # exporting a partition as an ONNX model (for EPs that import ONNX)
    "partition_model",
    "initializer_array",
    "WeightsFile",
    "ExternalRef",
    "plan_weights_file",
    # the EP context cache
    "ContextWriter",
    "ContextReader",
    "BinaryLayout",
    "BinaryFile",
    "EntryLocation",
    "EPContextNode",
    "is_ep_context",
    "DOMAIN",
    "OP_TYPE",
    "OPSET_VERSION",
    "dump_document",
    "load_document",
    "align",
    "same_bytes",
    "release_pages",
    "byte_view",
    "mapped_file",
    "to_numpy",
]
