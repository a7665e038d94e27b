"""The devices OpenVINO serves: the CPU, and the GPUs and NPUs in ``Core.available_devices``.

``discover_hardware`` reports the GPUs / NPUs OpenVINO sees (the OS's CPU is discovered by the framework);
``supported_devices`` offers one EP device per device OpenVINO can run on, with ``device_type`` in its
``ep_options`` (the provider option that makes the EP use it). OpenVINO is imported only when these run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from epctx.ep import SUPPORTED_MODES_KEY, WEIGHTLESS_SUPPORT_KEY, EpDevice, HardwareDevice, HardwareDeviceType

__all__ = ["OPENVINO_DEVICE_KEY", "discover_hardware", "supported_devices"]

OPENVINO_DEVICE_KEY = "openvino_device"  # hardware metadata: OpenVINO's name of the device ("GPU.0")
_INTEL = 0x8086
_TYPES = {"GPU": HardwareDeviceType.GPU, "NPU": HardwareDeviceType.NPU}


def _core() -> Any:
    from epctx.providers.openvino.provider import shared_core

    return shared_core()


def _property(core: Any, device: str, key: str) -> str:
    try:
        value = core.get_property(device, key)
    except (RuntimeError, TypeError):
        return ""
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _device_id(text: str) -> int:
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return 0


def describe(core: Any, name: str) -> HardwareDevice | None:
    """The hardware device behind OpenVINO's device ``name`` (None for the CPU and virtual plugins)."""
    kind = _TYPES.get(name.split(".")[0])
    if kind is None:
        return None
    metadata = {OPENVINO_DEVICE_KEY: name}
    full_name = _property(core, name, "FULL_DEVICE_NAME")
    if full_name:
        metadata["model_name"] = full_name
    architecture = _property(core, name, "DEVICE_ARCHITECTURE")
    if architecture:
        metadata["architecture"] = architecture
    device_type = _property(core, name, "DEVICE_TYPE")
    if device_type:
        metadata["Discrete"] = "1" if "discrete" in device_type.lower() else "0"
    return HardwareDevice(kind, _INTEL, _device_id(_property(core, name, "DEVICE_ID")), "Intel", metadata)


def discover_hardware() -> list[HardwareDevice]:
    """The GPUs and NPUs in ``ov.Core().available_devices``."""
    core = _core()
    found = [describe(core, name) for name in core.available_devices]
    return [hw for hw in found if hw is not None]


def supported_devices(ep_name: str, ep_vendor: str, hardware: Sequence[HardwareDevice]) -> list[EpDevice]:
    """One EP device per device of ``hardware`` OpenVINO runs on: the CPU when OpenVINO lists it, and each
    GPU / NPU it discovered (``ep_options["device_type"]`` names it)."""
    import openvino as ov

    core = _core()
    available = list(core.available_devices)
    # onnxruntime's weightless keys (source_weights.py; measured on the CPU plugin)
    metadata = {
        "version": ov.get_version(),
        SUPPORTED_MODES_KEY: "external_only",
        WEIGHTLESS_SUPPORT_KEY: "external_only",
    }
    devices = []
    for hw in hardware:
        if hw.is_virtual:
            continue
        if hw.type == HardwareDeviceType.CPU and "CPU" in available:
            devices.append(EpDevice(ep_name, ep_vendor, metadata, {"device_type": "CPU"}, hw))
        elif hw.metadata.get(OPENVINO_DEVICE_KEY) in available:
            options = {"device_type": hw.metadata[OPENVINO_DEVICE_KEY]}
            devices.append(EpDevice(ep_name, ep_vendor, metadata, options, hw))
    return devices
