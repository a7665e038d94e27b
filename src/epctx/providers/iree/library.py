"""The IREE EP as a plugin EP library (``create_ep_factories``), which replaces the folder's declaration
while registered: registered under a name ending in ``.virtual`` it also offers the virtual CPUs of
``devices.virtual_devices`` (cross-compilation targets).

    epctx.register_execution_provider_library("iree.virtual", "epctx.providers.iree.library")
    device = next(d for d in epctx.get_ep_devices()
                  if d.ep_name == "IREEExecutionProvider" and d.device.metadata.get("target") == "aarch64")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from epctx.providers.iree import EP_NAME, EP_VENDOR, compatibility
from epctx.providers.iree.devices import supported_devices, virtual_devices

if TYPE_CHECKING:
    from epctx.ep import (
        CompatibilityVerdict,
        DeviceIncompatibility,
        EpDevice,
        ExecutionProvider,
        HardwareDevice,
    )

__all__ = ["IREEFactory", "create_ep_factories"]


class IREEFactory:
    def __init__(self, allow_virtual: bool) -> None:
        self.allow_virtual = allow_virtual

    @property
    def ep_name(self) -> str:
        return EP_NAME

    @property
    def ep_vendor(self) -> str:
        return EP_VENDOR

    def get_supported_devices(self, hardware_devices: Sequence[HardwareDevice]) -> list[EpDevice]:
        devices = supported_devices(EP_NAME, EP_VENDOR, hardware_devices)
        if self.allow_virtual:
            devices += virtual_devices(EP_NAME, EP_VENDOR)
        return devices

    # The optional verdict hooks of a plugin factory (onnxruntime's ValidateCompiledModelCompatibilityInfo and
    # GetHardwareDeviceIncompatibilityDetails): a virtual device is judged as the CPU its target names.
    def validate_compatibility_info(
        self, info: str, devices: Sequence[HardwareDevice]
    ) -> CompatibilityVerdict:
        return compatibility.validate(info, devices)

    def device_incompatibility(self, device: HardwareDevice) -> DeviceIncompatibility:
        return compatibility.device_incompatibility(device)

    def create_ep(self, ep_devices: Sequence[EpDevice], ep_options: Mapping[str, str]) -> ExecutionProvider:
        from epctx.errors import InvalidArgument
        from epctx.providers.iree.provider import IREEExecutionProvider

        targets = {d.ep_options.get("target", "host") for d in ep_devices}
        if len(targets) > 1:
            raise InvalidArgument(f"{EP_NAME} compiles for one target per session, got {sorted(targets)}")
        options = {"target": targets.pop()} if targets else {}
        options.update({k: str(v) for k, v in ep_options.items()})
        return IREEExecutionProvider(options)


def create_ep_factories(registration_name: str, env_config: Mapping[str, str]) -> list[IREEFactory]:
    from epctx.ep import ALLOW_VIRTUAL_DEVICES

    return [IREEFactory(env_config.get(ALLOW_VIRTUAL_DEVICES) == "1")]
