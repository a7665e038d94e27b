"""The CPU of this machine as a :class:`~epctx.ep.HardwareDevice`, read from the OS (``/proc/cpuinfo`` on
Linux, ``sysctl`` on macOS, ``platform`` elsewhere). Vendor ids are those ONNX Runtime reports (PCI vendor
ids for x86, ACPI-style ids for Arm SoC vendors)."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from collections.abc import Mapping

from epctx.ep._devices import HardwareDevice, HardwareDeviceType

__all__ = ["ARM_IMPLEMENTERS", "X86_VENDORS", "cpu_device", "parse_cpuinfo"]

# x86 CPUID vendor string -> (vendor id, vendor name)
X86_VENDORS: Mapping[str, tuple[int, str]] = {
    "GenuineIntel": (0x8086, "Intel"),
    "AuthenticAMD": (0x1022, "AMD"),
    "HygonGenuine": (0x1D94, "Hygon"),
    "CentaurHauls": (0x1D17, "Centaur"),
    "  Shanghai  ": (0x1D17, "Zhaoxin"),
}
# Arm "CPU implementer" code -> (vendor id, vendor name); ids as ORT reports them where it has one
# (Qualcomm "QCOM", NVIDIA and Apple PCI ids), else the implementer code itself.
ARM_IMPLEMENTERS: Mapping[int, tuple[int, str]] = {
    0x41: (0x41, "ARM"),
    0x42: (0x42, "Broadcom"),
    0x43: (0x43, "Cavium"),
    0x46: (0x46, "Fujitsu"),
    0x48: (0x48, "HiSilicon"),
    0x4E: (0x10DE, "NVIDIA"),
    0x50: (0x50, "Applied Micro"),
    0x51: (0x4D4F4351, "Qualcomm"),
    0x53: (0x53, "Samsung"),
    0x56: (0x56, "Marvell"),
    0x61: (0x106B, "Apple"),
    0x69: (0x8086, "Intel"),
    0xC0: (0xC0, "Ampere"),
}


def parse_cpuinfo(text: str) -> HardwareDevice:
    """The CPU described by the text of ``/proc/cpuinfo`` (its first processor)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor is enough
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    metadata: dict[str, str] = {}
    vendor_id, vendor, device_id = 0, "unknown", 0
    vendor_string = fields.get("vendor_id", "")
    if vendor_string:
        vendor_id, vendor = X86_VENDORS.get(vendor_string, (0, vendor_string))
        metadata["cpuid_vendor"] = vendor_string
        for key in ("cpu family", "model", "stepping"):
            if fields.get(key, "").isdigit():
                metadata[key.replace(" ", "_")] = fields[key]
        device_id = int(fields.get("model", "0")) if fields.get("model", "").isdigit() else 0
    elif "cpu implementer" in fields:
        code = _int(fields["cpu implementer"])
        vendor_id, vendor = ARM_IMPLEMENTERS.get(code, (code, f"Arm implementer {code:#x}"))
        metadata["cpu_implementer"] = f"{code:#x}"
        device_id = _int(fields.get("cpu part", "0"))
        if "cpu part" in fields:
            metadata["cpu_part"] = f"{device_id:#x}"
    name = fields.get("model name") or fields.get("hardware") or fields.get("processor", "")
    if name and not name.isdigit():
        metadata["model_name"] = name
    return HardwareDevice(HardwareDeviceType.CPU, vendor_id, device_id, vendor, metadata)


def _int(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        return 0


def cpu_device() -> HardwareDevice:
    """This machine's CPU (logical core count in metadata ``cores``)."""
    device = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            device = parse_cpuinfo(f.read())
    except OSError:
        device = _cpu_elsewhere()
    metadata = dict(device.metadata)
    metadata["cores"] = str(os.cpu_count() or 1)
    metadata.setdefault("architecture", platform.machine())
    return HardwareDevice(device.type, device.vendor_id, device.device_id, device.vendor, metadata)


def _cpu_elsewhere() -> HardwareDevice:
    name = platform.processor()
    if platform.system() == "Darwin":
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            name = (
                subprocess.run(
                    ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
                ).stdout.strip()
                or name
            )
    lowered = name.lower()
    vendor_id, vendor = 0, "unknown"
    if "intel" in lowered:
        vendor_id, vendor = X86_VENDORS["GenuineIntel"]
    elif "amd" in lowered:
        vendor_id, vendor = X86_VENDORS["AuthenticAMD"]
    elif "apple" in lowered:
        vendor_id, vendor = ARM_IMPLEMENTERS[0x61]
    return HardwareDevice(HardwareDeviceType.CPU, vendor_id, 0, vendor, {"model_name": name} if name else {})
