"""epctx: an ONNX runtime built around the EP context cache. The API mirrors onnxruntime's."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from epctx import capi, errors
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
    import os

    from epctx.cache.compatibility import (
        get_compatibility_info_from_model,
        get_compatibility_info_from_model_bytes,
        get_hardware_device_ep_incompatibility_details,
        get_model_compatibility_for_ep_devices,
    )
    from epctx.compiler import CompileFlags, ExternalInitializerInfo, ModelCompiler
    from epctx.compiler import CompileFlags as OrtCompileApiFlags
    from epctx.ep._compatibility import (
        CompatibilityVerdict,
        OrtCompiledModelCompatibility,
        OrtDeviceEpIncompatibilityReason,
    )
    from epctx.ep._devices import EpDevice as OrtEpDevice
    from epctx.ep._devices import ExecutionProviderDevicePolicy as OrtExecutionProviderDevicePolicy
    from epctx.ep._devices import HardwareDevice as OrtHardwareDevice
    from epctx.ep._devices import HardwareDeviceType as OrtHardwareDeviceType
    from epctx.session import InferenceSession, OrtValue, SessionIOBinding
    from epctx.session import SessionIOBinding as IOBinding
    from epctx.session.node_arg import ModelMetadata, NodeArg
    from epctx.session.package import ModelPackageComponentContext, ModelPackageContext, ModelPackageOptions

__all__ = [
    "CompileFlags",
    "ExternalInitializerInfo",
    "ModelCompiler",
    "OrtCompileApiFlags",
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
    "capi",
    "errors",
    "get_all_providers",
    "get_available_providers",
    "get_device",
    "set_default_logger_severity",
    "set_default_logger_verbosity",
    # values and bindings
    "IOBinding",
    "OrtValue",
    "SessionIOBinding",
    # plugin EP libraries and devices (onnxruntime's names)
    "OrtEpDevice",
    "OrtExecutionProviderDevicePolicy",
    "OrtHardwareDevice",
    "OrtHardwareDeviceType",
    "get_ep_devices",
    "register_execution_provider_library",
    "unregister_execution_provider_library",
    # compiled model compatibility (onnxruntime's names)
    "CompatibilityVerdict",
    "OrtCompiledModelCompatibility",
    "OrtDeviceEpIncompatibilityReason",
    "get_compatibility_info_from_model",
    "get_compatibility_info_from_model_bytes",
    "get_hardware_device_ep_incompatibility_details",
    "get_model_compatibility_for_ep_devices",
    # model packages (onnxruntime's names; selection ranks every EP and device)
    "ModelPackageComponentContext",
    "ModelPackageContext",
    "ModelPackageOptions",
]

from epctx._version import __version__ as __version__

# The session and the compile API are imported on first use, so that `import epctx` stays light (a session over a
# context model then imports only its lean load path).
_LAZY = {
    "CompileFlags": "epctx.compiler",
    "ExternalInitializerInfo": "epctx.compiler",
    "ModelCompiler": "epctx.compiler",
    "OrtCompileApiFlags": "epctx.compiler:CompileFlags",
    "InferenceSession": "epctx.session",
    "ModelPackageComponentContext": "epctx.session.package",
    "ModelPackageContext": "epctx.session.package",
    "ModelPackageOptions": "epctx.session.package",
    "IOBinding": "epctx.session:SessionIOBinding",
    "OrtValue": "epctx.session",
    "SessionIOBinding": "epctx.session",
    "ModelMetadata": "epctx.session.node_arg",
    "NodeArg": "epctx.session.node_arg",
    "OrtEpDevice": "epctx.ep._devices:EpDevice",
    "OrtExecutionProviderDevicePolicy": "epctx.ep._devices:ExecutionProviderDevicePolicy",
    "OrtHardwareDevice": "epctx.ep._devices:HardwareDevice",
    "OrtHardwareDeviceType": "epctx.ep._devices:HardwareDeviceType",
    "CompatibilityVerdict": "epctx.ep._compatibility",
    "OrtCompiledModelCompatibility": "epctx.ep._compatibility",
    "OrtDeviceEpIncompatibilityReason": "epctx.ep._compatibility",
    **{
        name: "epctx.cache.compatibility"
        for name in (
            "get_compatibility_info_from_model",
            "get_compatibility_info_from_model_bytes",
            "get_hardware_device_ep_incompatibility_details",
            "get_model_compatibility_for_ep_devices",
        )
    },
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'epctx' has no attribute {name!r}")
    module, _, attr = module.partition(":")
    value = getattr(importlib.import_module(module), attr or name)
    globals()[name] = value
    return value


def get_all_providers() -> list[str]:
    """Every execution provider this installation of epctx supports, including those whose backend is not
    installed on this machine (onnxruntime's ``get_all_providers``; ``get_available_providers`` lists the usable
    ones), CPU last."""
    from epctx.providers.registry import all_providers

    return all_providers()


def get_available_providers() -> list[str]:
    """Execution providers usable on this machine, in default precedence order (CPU last)."""
    from epctx.providers.registry import available_providers

    return available_providers()


def get_ep_devices() -> list[OrtEpDevice]:
    """Every (EP, device) pair usable here: built-in EPs, entry-point and registered plugin EP libraries."""
    from epctx.providers.registry import get_ep_devices as discover

    return discover()


def register_execution_provider_library(registration_name: str, path: str | os.PathLike[str]) -> None:
    """Load a plugin EP library (a Python file or an importable module exposing ``create_ep_factories``); a
    name ending in ``.virtual`` allows it virtual devices (cross-compilation)."""
    from epctx.providers.registry import register_execution_provider_library as register

    register(registration_name, path)


def unregister_execution_provider_library(registration_name: str) -> None:
    """Unload a registered plugin EP library (fails while a session or ModelCompiler holds one of its EPs)."""
    from epctx.providers.registry import unregister_execution_provider_library as unregister

    unregister(registration_name)


def get_device() -> str:
    """The default device, as onnxruntime's ``get_device()`` names it: "CPU" (each EP's devices are listed by
    ``get_ep_devices()``)."""
    return "CPU"


def set_default_logger_severity(severity: int) -> None:
    """The ``epctx`` logger's level from onnxruntime's severity: 0 verbose (DEBUG), 1 info, 2 warning, 3 error,
    4 fatal (CRITICAL)."""
    from epctx.session.logs import set_default_logger_severity as set_severity

    set_severity(severity)


def set_default_logger_verbosity(verbosity: int) -> None:
    """Checked and accepted: onnxruntime's VLOG levels have no finer ``logging`` level (see epctx.session.logs)."""
    from epctx.session.logs import set_default_logger_verbosity as set_verbosity

    set_verbosity(verbosity)
