"""onnxruntime's exception classes where its users catch them (``onnxruntime.capi.onnxruntime_pybind11_state``).

Each is the epctx error of the same status (``epctx.errors``), so ``except Fail`` written for onnxruntime
catches what epctx raises, and every one of them is also an :class:`epctx.errors.EPCtxError`."""

from epctx.errors import (
    EngineError,
    EPFail,
    Fail,
    InvalidArgument,
    InvalidGraph,
    InvalidProtobuf,
    ModelLoadCanceled,
    ModelLoaded,
    ModelRequiresCompilation,
    NoModel,
    NoSuchFile,
    NotFound,
    NotImplemented,
    RuntimeException,
)

__all__ = [
    "EPFail",
    "EngineError",
    "Fail",
    "InvalidArgument",
    "InvalidGraph",
    "InvalidProtobuf",
    "ModelLoadCanceled",
    "ModelLoaded",
    "ModelRequiresCompilation",
    "NoModel",
    "NoSuchFile",
    "NotFound",
    "NotImplemented",
    "RuntimeException",
]
