"""onnxruntime's exception classes where its users catch them (``onnxruntime.capi.onnxruntime_pybind11_state``),
and the compiled model compatibility API its users import from there.

Each is the epctx error of the same status (``epctx.errors``), so ``except Fail`` written for onnxruntime
catches what epctx raises, and every one of them is also an :class:`epctx.errors.EPCtxError`."""

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from epctx.cache.compatibility import (
        get_compatibility_info_from_model,
        get_compatibility_info_from_model_bytes,
        get_hardware_device_ep_incompatibility_details,
        get_model_compatibility_for_ep_devices,
    )
    from epctx.ep.compatibility import OrtCompiledModelCompatibility, OrtDeviceEpIncompatibilityReason

__all__ = [
    "OrtCompiledModelCompatibility",
    "OrtDeviceEpIncompatibilityReason",
    "get_compatibility_info_from_model",
    "get_compatibility_info_from_model_bytes",
    "get_hardware_device_ep_incompatibility_details",
    "get_model_compatibility_for_ep_devices",
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

_COMPATIBILITY = {
    "OrtCompiledModelCompatibility": "epctx.ep.compatibility",
    "OrtDeviceEpIncompatibilityReason": "epctx.ep.compatibility",
    "get_compatibility_info_from_model": "epctx.cache.compatibility",
    "get_compatibility_info_from_model_bytes": "epctx.cache.compatibility",
    "get_hardware_device_ep_incompatibility_details": "epctx.cache.compatibility",
    "get_model_compatibility_for_ep_devices": "epctx.cache.compatibility",
}


def __getattr__(name: str) -> Any:
    """The compatibility API, imported on first use (``import epctx`` imports none of it)."""
    module = _COMPATIBILITY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
