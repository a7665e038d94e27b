"""epctx: an ONNX runtime built around the EP context cache. The API mirrors onnxruntime's."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from epctx import errors
from epctx.compiler import CompileFlags, ExternalInitializerInfo, ModelCompiler
from epctx.errors import (
    EPFail,
    Fail,
    InvalidArgument,
    InvalidGraph,
    ModelRequiresCompilation,
    NoSuchFile,
    NotImplemented,
)
from epctx.options import ExecutionMode, GraphOptimizationLevel, RunOptions, SessionOptions

if TYPE_CHECKING:
    from epctx.session import InferenceSession
    from epctx.session.node_arg import ModelMetadata, NodeArg

__all__ = [
    "CompileFlags",
    "ExternalInitializerInfo",
    "ModelCompiler",
    "EPFail",
    "ExecutionMode",
    "Fail",
    "GraphOptimizationLevel",
    "InferenceSession",
    "InvalidArgument",
    "InvalidGraph",
    "ModelMetadata",
    "ModelRequiresCompilation",
    "NoSuchFile",
    "NodeArg",
    "NotImplemented",
    "RunOptions",
    "SessionOptions",
    "errors",
    "get_available_providers",
]

__version__ = "0.1.0"

# The session layer pulls in onnx and onnx-ir (and onnx-ir pulls sympy): imported on first use, so that
# `import epctx` stays light.
_LAZY = {
    "InferenceSession": "epctx.session",
    "ModelMetadata": "epctx.session.node_arg",
    "NodeArg": "epctx.session.node_arg",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'epctx' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def get_available_providers() -> list[str]:
    """Execution providers usable on this machine, in default precedence order (CPU last)."""
    from epctx.providers.registry import available_providers

    return available_providers()
