"""epctx: an ONNX runtime built around the EP context cache. The API mirrors onnxruntime's."""

from __future__ import annotations

from epctx import errors
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
from epctx.providers.registry import available_providers as get_available_providers
from epctx.session import InferenceSession
from epctx.session.node_arg import ModelMetadata, NodeArg

__all__ = [
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
