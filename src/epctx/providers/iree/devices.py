"""The devices the IREE EP serves: this machine's CPU, and, when its library is allowed virtual devices, one
virtual CPU per non-host target preset (``ep_options["target"]`` names it): compiling for one writes a context
model that is refused here and runs on that CPU."""

from __future__ import annotations

from collections.abc import Sequence

from epctx.ep import (
    SUPPORTED_MODES_KEY,
    VIRTUAL_METADATA_KEY,
    WEIGHTLESS_SUPPORT_KEY,
    EpDevice,
    HardwareDevice,
    HardwareDeviceType,
)
from epctx.providers.iree.targets import PRESETS

__all__ = ["TARGET_KEY", "supported_devices", "virtual_devices"]

TARGET_KEY = "target"  # the provider option, and the metadata of a virtual device, naming the target
_VENDOR = "IREE"


def _metadata() -> dict[str, str]:
    from epctx.providers.iree.compatibility import iree_version

    # onnxruntime's weightless keys: the newer one, and the earlier one with the value it would have had
    return {
        "version": iree_version(),
        SUPPORTED_MODES_KEY: "all_or_external_only",
        WEIGHTLESS_SUPPORT_KEY: "all",
    }


def supported_devices(ep_name: str, ep_vendor: str, hardware: Sequence[HardwareDevice]) -> list[EpDevice]:
    """The CPU(s) of ``hardware`` (not virtual ones), compiled for as ``target=host``."""
    return [
        EpDevice(ep_name, ep_vendor, _metadata(), {TARGET_KEY: "host"}, hw)
        for hw in hardware
        if hw.type == HardwareDeviceType.CPU and not hw.is_virtual
    ]


def virtual_devices(ep_name: str, ep_vendor: str) -> list[EpDevice]:
    """One virtual CPU per target preset (cross-compilation)."""
    devices = []
    for k, (name, target) in enumerate(PRESETS.items()):
        metadata = {VIRTUAL_METADATA_KEY: "1", TARGET_KEY: name, "target_triple": target.triple}
        hw = HardwareDevice(HardwareDeviceType.CPU, 0, k + 1, _VENDOR, metadata)
        devices.append(EpDevice(ep_name, ep_vendor, _metadata(), {TARGET_KEY: name}, hw))
    return devices
