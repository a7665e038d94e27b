"""The OpenVINO execution provider (the ``openvino`` package; imported only when the EP is selected or its
devices are listed).

The declaration below is how the registry finds this EP (by its folder); it imports nothing, OpenVINO
included."""

from __future__ import annotations

from typing import Any

EP_NAME = "OpenVINOExecutionProvider"
EP_CLASS = "epctx.providers.openvino.provider:OpenVINOExecutionProvider"
EP_VENDOR = "Intel"
EP_REQUIRES = ("openvino",)
EP_COMPATIBILITY = (
    "epctx.providers.openvino.compatibility"  # its compatibility verdicts, without importing the backend
)
EP_DEVICES = "epctx.providers.openvino.devices:supported_devices"  # which devices it serves
EP_HARDWARE = "epctx.providers.openvino.devices:discover_hardware"  # GPUs and NPUs OpenVINO sees
EP_PAYLOADS = "epctx.providers.openvino.payloads:detect"  # what ORT's OpenVINO EP writes (epctx inspect)

__all__ = ["OpenVINOExecutionProvider"]


def __getattr__(name: str) -> Any:
    if name == "OpenVINOExecutionProvider":
        from epctx.providers.openvino.provider import OpenVINOExecutionProvider

        return OpenVINOExecutionProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
