"""onnxruntime's compatibility API (1.23+), same names and semantics, over epctx's EPs:

- :func:`get_compatibility_info_from_model` / :func:`get_compatibility_info_from_model_bytes`: the string an EP
  wrote at compile (model metadata ``ep_compatibility_info.<EP>``), or None;
- :func:`get_model_compatibility_for_ep_devices`: the EP's verdict on a string for some of its devices (all of
  one EP); an EP without a validator answers ``EP_NOT_APPLICABLE``;
- :func:`get_hardware_device_ep_incompatibility_details`: why an EP cannot use a hardware device.

:func:`validate_for_ep_devices` / :func:`validate_for_ep` give the explained verdict
(:class:`~epctx.ep.CompatibilityVerdict`) behind the enum. Nothing here reads a payload or imports a backend:
the model's metadata is read from its top-level message only (initializers and nodes skipped), and built-in
EPs judge through their folder's ``EP_COMPATIBILITY`` module.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from epctx.ep._compatibility import (
    METADATA_PREFIX,
    CompatibilityVerdict,
    DeviceIncompatibility,
    OrtCompiledModelCompatibility,
    OrtDeviceEpIncompatibilityReason,
)
from epctx.errors import InvalidArgument, InvalidProtobuf

if TYPE_CHECKING:
    from epctx.ep._devices import EpDevice, HardwareDevice

__all__ = [
    "METADATA_PREFIX",
    "get_compatibility_info_from_model",
    "get_compatibility_info_from_model_bytes",
    "get_hardware_device_ep_incompatibility_details",
    "get_model_compatibility_for_ep_devices",
    "model_metadata",
    "validate_for_ep",
    "validate_for_ep_devices",
]


def model_metadata(data: bytes | bytearray | memoryview | mmap.mmap, where: str) -> dict[str, str]:
    """The ``metadata_props`` of a serialized model, read from its top-level message only."""
    from epctx.model.wire import WireError, fields, text

    found: dict[str, str] = {}
    seen_graph = False
    try:
        for number, _, value in fields(memoryview(data)):
            if number == 7:
                seen_graph = True
            elif number == 14 and isinstance(value, memoryview):
                entry = {n: text(v) for n, _, v in fields(value) if n in (1, 2)}
                found[str(entry.get(1, ""))] = str(entry.get(2, ""))
    except (WireError, UnicodeDecodeError) as exc:
        raise InvalidProtobuf(f"{where} is not an ONNX model: {exc}") from exc
    if not seen_graph:
        raise InvalidProtobuf(f"{where} is not an ONNX model: it has no graph")
    return found


def _check_ep(ep_type: object) -> str:
    if not isinstance(ep_type, str) or not ep_type:
        raise InvalidArgument(f"ep_type must be a non-empty string, got {ep_type!r}")
    return ep_type


def get_compatibility_info_from_model(model_path: str | os.PathLike[str], ep_type: str) -> str | None:
    """The compatibility string ``ep_type`` wrote into the model at ``model_path`` (None: it wrote none)."""
    path = os.fspath(model_path)
    if not path:
        raise InvalidArgument("model_path must not be empty")
    ep_type = _check_ep(ep_type)
    from pathlib import Path

    from epctx.cache.scan import read_mapped

    metadata = read_mapped(Path(path), lambda view: model_metadata(view, f"model {path!r}"))
    return metadata.get(METADATA_PREFIX + ep_type)


def get_compatibility_info_from_model_bytes(model_data: Any, ep_type: str) -> str | None:
    """:func:`get_compatibility_info_from_model` for a model in memory (any buffer)."""
    data = memoryview(model_data)
    if not data.nbytes:
        raise InvalidArgument("model_data must not be empty")
    ep_type = _check_ep(ep_type)
    return model_metadata(data.cast("B"), "model bytes").get(METADATA_PREFIX + ep_type)


def _factory(ep_name: str) -> Any:
    from epctx.providers.registry import factories

    return next((f for f in factories() if f.ep_name == ep_name), None)


def validate_for_ep(ep_name: str, info: str, devices: Sequence[HardwareDevice]) -> CompatibilityVerdict:
    """The explained verdict of EP ``ep_name`` (built-in, registered class or plugin library) on ``info``
    for ``devices`` (empty: this machine)."""
    factory = _factory(_check_ep(ep_name))
    if factory is None:
        return CompatibilityVerdict.unsupported(
            f"{ep_name} is not available here", advice="install or register the EP that compiled it"
        )
    validate = getattr(factory, "validate_compatibility_info", None)
    if validate is None:  # a plugin factory without the hook: onnxruntime's default
        return CompatibilityVerdict.not_applicable(f"{ep_name} does not judge compatibility strings")
    verdict = validate(info, list(devices))
    if not isinstance(verdict, CompatibilityVerdict):
        raise InvalidArgument(f"{ep_name}.validate_compatibility_info returned {verdict!r}, not a verdict")
    return verdict


def validate_for_ep_devices(ep_devices: Sequence[EpDevice], compatibility_info: str) -> CompatibilityVerdict:
    """:func:`get_model_compatibility_for_ep_devices` with the reasons and the advice."""
    if not isinstance(compatibility_info, str):
        raise TypeError(f"compatibility_info must be a str, got {type(compatibility_info).__name__}")
    devices = list(ep_devices)
    if not devices:
        raise InvalidArgument("ep_devices must hold one or more EP devices")
    names = sorted({d.ep_name for d in devices})
    if len(names) != 1:
        raise InvalidArgument(f"all EP devices must belong to the same execution provider, got {names}")
    return validate_for_ep(names[0], compatibility_info, [d.device for d in devices])


def get_model_compatibility_for_ep_devices(
    ep_devices: Sequence[EpDevice], compatibility_info: str
) -> OrtCompiledModelCompatibility:
    """How well a model compiled with ``compatibility_info`` suits ``ep_devices`` (all of one EP)."""
    return validate_for_ep_devices(ep_devices, compatibility_info).status


def get_hardware_device_ep_incompatibility_details(
    ep_type: str, hardware_device: HardwareDevice
) -> dict[str, Any]:
    """``{"reasons_bitmask", "notes", "error_code"}``: why EP ``ep_type`` cannot use ``hardware_device``
    (0: no known incompatibility). An EP whose Python packages are missing is ``MISSING_DEPENDENCY``."""
    from epctx.providers.builtin import builtin

    ep_type = _check_ep(ep_type)
    decl = builtin(ep_type)
    if decl is not None and decl.missing():
        return DeviceIncompatibility(
            int(OrtDeviceEpIncompatibilityReason.MISSING_DEPENDENCY),
            f"{ep_type} needs the Python package(s) {', '.join(decl.missing())}, which are not installed",
        ).as_dict()
    factory = _factory(ep_type)
    if factory is None:
        raise InvalidArgument(f"unknown execution provider {ep_type!r}")
    hook = getattr(factory, "device_incompatibility", None)
    details = hook(hardware_device) if hook is not None else DeviceIncompatibility()
    if not isinstance(details, DeviceIncompatibility):
        raise InvalidArgument(f"{ep_type}.device_incompatibility returned {details!r}")
    return details.as_dict()
