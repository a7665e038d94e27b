"""The IREE EP as a plugin EP library (``create_ep_factories``), which replaces the folder's declaration
while registered: registered under a name ending in ``.virtual`` it also offers the virtual CPUs of
``devices.virtual_devices`` (cross-compilation targets).

    epctx.register_execution_provider_library("iree.virtual", "epctx.providers.iree.library")
    device = next(d for d in epctx.get_ep_devices()
                  if d.ep_name == "IREEExecutionProvider" and d.device.metadata.get("target") == "aarch64")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from epctx.ep import PluginEpFactory
from epctx.providers.iree import EP_CLASS, EP_NAME, EP_VENDOR, compatibility
from epctx.providers.iree.devices import supported_devices, virtual_devices

if TYPE_CHECKING:
    from epctx.ep import (
        CompatibilityVerdict,
        DeviceIncompatibility,
        EpDevice,
        HardwareDevice,
    )

__all__ = ["IREEFactory", "create_ep_factories"]


class IREEFactory(PluginEpFactory):
    ep_name = EP_NAME
    ep_vendor = EP_VENDOR
    ep_api_version = "2.0"
    ep_class = EP_CLASS  # imported on the first create_ep; the devices' target option goes with it

    def devices(self, hardware_devices: Sequence[HardwareDevice]) -> list[EpDevice]:
        return supported_devices(EP_NAME, EP_VENDOR, hardware_devices)

    def virtual_devices(self) -> list[EpDevice]:
        return virtual_devices(EP_NAME, EP_VENDOR)

    # The optional verdict hooks of a plugin factory (onnxruntime's ValidateCompiledModelCompatibilityInfo and
    # GetHardwareDeviceIncompatibilityDetails): a virtual device is judged as the CPU its target names.
    def validate_compatibility_info(
        self, info: str, devices: Sequence[HardwareDevice]
    ) -> CompatibilityVerdict:
        return compatibility.validate(info, devices)

    def device_incompatibility(self, device: HardwareDevice) -> DeviceIncompatibility:
        return compatibility.device_incompatibility(device)


create_ep_factories = IREEFactory.create_ep_factories
