"""The OpenVINO EP's compatibility string and verdicts (no OpenVINO import: the version comes from the
installed package's ``dist-info`` name, the CPU from the OS).

The string (``ep_compatibility_info.OpenVINOExecutionProvider``)::

    sdk=openvino-<ov.get_version()>;device=CPU;architecture=intel64;name=<FULL_DEVICE_NAME>;
    capabilities=BF16,FP32,...;precision=f32;weightless=0

Verdicts: another OpenVINO release is UNSUPPORTED (``import_model`` takes blobs of its own release only);
a blob for another device type or CPU architecture is UNSUPPORTED; a CPU blob made on another CPU model runs
(the CPU plugin re-creates its kernels at import) but its precisions and graph transformations were chosen
for that CPU: SUPPORTED_PREFER_RECOMPILATION; otherwise SUPPORTED_OPTIMAL.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence

from epctx.ep import (
    CompatibilityVerdict,
    HardwareDevice,
    HardwareDeviceType,
    cpu_device,
    format_info,
    installed_version,
    parse_own_info,
)

__all__ = ["compatibility_info", "openvino_release", "validate"]

_SDK = "openvino-"
_RECOMPILE = "recompile the context from its source model on this machine"
_ARCHITECTURES = {"x86_64": "intel64", "amd64": "intel64", "aarch64": "arm64", "arm64": "arm64"}
_TYPES = {"CPU": HardwareDeviceType.CPU, "GPU": HardwareDeviceType.GPU, "NPU": HardwareDeviceType.NPU}


def openvino_release() -> str:
    """The installed OpenVINO's release (``2026.4.1``), without importing it."""
    return installed_version("openvino", "openvino") or "unknown"


def compatibility_info(
    sdk_version: str, device: str, hardware: str, precision: str | None, weightless: bool
) -> str:
    """The string written at compile. ``hardware`` is the EP's ``device/architecture/name/capabilities``."""
    parts = hardware.split("/")
    parts += [""] * (4 - len(parts))
    return format_info(
        {
            "sdk": sdk_version,
            "device": device,
            "architecture": parts[1],
            "name": parts[2].replace(";", ","),
            "capabilities": "/".join(parts[3:]).replace(";", ","),
            "precision": precision or "",
            "weightless": "1" if weightless else "0",
        }
    )


def validate(info: str, devices: Sequence[HardwareDevice]) -> CompatibilityVerdict:
    fields, foreign = parse_own_info(info, _SDK, "OpenVINO")
    if foreign is not None:
        return foreign
    sdk = fields["sdk"]
    made, here = sdk.removeprefix(_SDK).split("-")[0], openvino_release()
    if made != here:
        return CompatibilityVerdict.unsupported(
            f"compiled by OpenVINO {made}, this is OpenVINO {here}",
            advice=f"OpenVINO imports the blobs of its own release only: {_RECOMPILE}",
        )
    judged: list[HardwareDevice | None] = [*devices] or [None]  # none given: this machine
    return CompatibilityVerdict.worst(_judge(fields, d) for d in judged)


def _judge(fields: dict[str, str], device: HardwareDevice | None) -> CompatibilityVerdict:
    compiled_for = fields.get("device", "CPU")
    kind = _TYPES.get(compiled_for.split(".")[0])
    if device is not None and kind is not None and device.type != kind:
        return CompatibilityVerdict.unsupported(
            f"compiled for OpenVINO device {compiled_for}, the device is a {device.type.name}",
            advice=f"load it with device_type={compiled_for}, or {_RECOMPILE} for this device",
        )
    if kind != HardwareDeviceType.CPU:
        return CompatibilityVerdict.optimal()
    if device is None:
        device = cpu_device()
    machine = device.metadata.get("architecture", platform.machine()).lower()
    architecture = _ARCHITECTURES.get(machine, machine)
    if fields.get("architecture") and fields["architecture"] != architecture:
        return CompatibilityVerdict.unsupported(
            f"compiled for a {fields['architecture']} CPU, this CPU is {architecture}", advice=_RECOMPILE
        )
    name, here = fields.get("name", ""), device.metadata.get("model_name", "")
    if name and here and name != here:
        return CompatibilityVerdict.prefer_recompilation(
            f"compiled on CPU {name!r}, this CPU is {here!r}: OpenVINO chose the blob's precisions and "
            "transformations for that CPU",
            advice=f"it runs: {_RECOMPILE} for code chosen for this CPU",
        )
    return CompatibilityVerdict.optimal()
