"""Hardware devices, the EP devices that serve them, and the factory a plugin EP library exposes.

Mirrors ONNX Runtime's plugin EP API: ``OrtHardwareDevice`` (``HardwareDevice``), ``OrtEpDevice``
(``EpDevice``), ``OrtEpFactory`` (``EpFactory``) and the selection policies. A plugin library is a Python file or
module with ``create_ep_factories(registration_name, env_config) -> list[EpFactory]``; ``env_config`` has
``allow_virtual_devices`` = "1" when the library was registered under a name ending in ``.virtual``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from epctx.errors import InvalidArgument

if TYPE_CHECKING:
    from epctx.ep._contract import ExecutionProvider

__all__ = [
    "EpDevice",
    "EpFactory",
    "ExecutionProviderDevicePolicy",
    "HardwareDevice",
    "HardwareDeviceType",
    "ALLOW_VIRTUAL_DEVICES",
    "VIRTUAL_METADATA_KEY",
    "device_options",
]

ALLOW_VIRTUAL_DEVICES = (
    "allow_virtual_devices"  # env_config key of a plugin library (kOrtEnvAllowVirtualDevices)
)
VIRTUAL_METADATA_KEY = "is_virtual"  # metadata of a virtual device (cross-compilation target): "1"


class HardwareDeviceType(enum.IntEnum):
    """``OrtHardwareDeviceType`` (same values)."""

    CPU = 0
    GPU = 1
    NPU = 2


class ExecutionProviderDevicePolicy(enum.IntEnum):
    """``OrtExecutionProviderDevicePolicy`` (same values): how a session picks devices when given none."""

    DEFAULT = 0
    PREFER_CPU = 1
    PREFER_NPU = 2
    PREFER_GPU = 3
    MAX_PERFORMANCE = 4
    MAX_EFFICIENCY = 5
    MIN_OVERALL_POWER = 6


def _frozen(mapping: Mapping[str, str] | None) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping or {}))


@dataclasses.dataclass(frozen=True)
class HardwareDevice:
    """A device of this machine (or a virtual one, metadata ``is_virtual`` = "1")."""

    type: HardwareDeviceType
    vendor_id: int
    device_id: int
    vendor: str
    metadata: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", HardwareDeviceType(self.type))
        object.__setattr__(self, "metadata", _frozen(self.metadata))

    @property
    def is_virtual(self) -> bool:
        return self.metadata.get(VIRTUAL_METADATA_KEY) == "1"

    def __hash__(self) -> int:
        return hash(
            (self.type, self.vendor_id, self.device_id, self.vendor, tuple(sorted(self.metadata.items())))
        )


@dataclasses.dataclass(frozen=True)
class EpDevice:
    """An EP able to run on a device, with the options and metadata it uses there."""

    ep_name: str
    ep_vendor: str
    ep_metadata: Mapping[str, str]
    ep_options: Mapping[str, str]
    device: HardwareDevice

    def __post_init__(self) -> None:
        object.__setattr__(self, "ep_metadata", _frozen(self.ep_metadata))
        object.__setattr__(self, "ep_options", _frozen(self.ep_options))

    def __hash__(self) -> int:
        return hash((self.ep_name, self.ep_vendor, self.device, tuple(sorted(self.ep_options.items()))))


class EpFactory(Protocol):
    """What ``create_ep_factories`` returns one of per EP the library provides (``OrtEpFactory``). A plugin
    library's factory also declares ``ep_api_version``, the ``epctx.ep.EP_API_VERSION`` it was written for
    (checked at registration; ``epctx.ep.PluginEpFactory`` is the base that holds the rest).

    Optional, as in onnxruntime: ``validate_compatibility_info(info, hardware_devices) -> CompatibilityVerdict``
    (judge a compatibility string its EP wrote, without loading anything; absent: ``EP_NOT_APPLICABLE``) and
    ``device_incompatibility(hardware_device) -> DeviceIncompatibility`` (absent: no known incompatibility);
    the EP class's classmethods of the same names are the usual implementation."""

    @property
    def ep_name(self) -> str: ...
    @property
    def ep_vendor(self) -> str: ...
    def get_supported_devices(self, hardware_devices: Sequence[HardwareDevice]) -> list[EpDevice]:
        """The EP devices this EP offers for ``hardware_devices`` (plus virtual ones when allowed)."""
        ...

    def create_ep(self, ep_devices: Sequence[EpDevice], ep_options: Mapping[str, str]) -> ExecutionProvider:
        """An EP instance for the chosen devices (all of this factory) with the session's options."""
        ...


def device_options(
    ep_name: str, ep_devices: Sequence[EpDevice], ep_options: Mapping[str, Any]
) -> dict[str, str]:
    """The options of an EP created for ``ep_devices``: the devices' ``ep_options`` (which must agree: one
    device per session), then the session's ``ep_options`` over them, as strings."""
    options: dict[str, str] = {}
    for device in ep_devices:
        for key, value in device.ep_options.items():
            if options.get(key, value) != value:
                raise InvalidArgument(
                    f"{ep_name} runs on one device per session: devices with {key}={options[key]!r} "
                    f"and {key}={value!r} were both selected"
                )
            options[key] = value
    options.update({str(k): str(v) for k, v in ep_options.items()})
    return options
