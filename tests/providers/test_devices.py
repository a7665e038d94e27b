"""Hardware discovery: the CPU from the OS (vendor and vendor id from the processor), the EPs' devices."""

from __future__ import annotations

import subprocess
import sys

import pytest

import epctx
from epctx.ep import HardwareDeviceType
from epctx.ep._hardware import cpu_device, parse_cpuinfo
from epctx.providers import registry

INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 154
model name\t: 12th Gen Intel(R) Core(TM) i7-1260P
stepping\t: 3

processor\t: 1
vendor_id\t: GenuineIntel
"""
AMD = "processor : 0\nvendor_id : AuthenticAMD\ncpu family : 25\nmodel : 17\nmodel name : AMD EPYC 9B14\n"
ARM = "processor\t: 0\nBogoMIPS\t: 48.00\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd0c\n"
QCOM = "processor\t: 0\nCPU implementer\t: 0x51\nCPU part\t: 0x001\n"


@pytest.mark.parametrize(
    ("text", "vendor", "vendor_id", "device_id", "name"),
    [
        (INTEL, "Intel", 0x8086, 154, "12th Gen Intel(R) Core(TM) i7-1260P"),
        (AMD, "AMD", 0x1022, 17, "AMD EPYC 9B14"),
        (ARM, "ARM", 0x41, 0xD0C, None),
        (QCOM, "Qualcomm", 0x4D4F4351, 0x1, None),
    ],
)
def test_cpuinfo(text, vendor, vendor_id, device_id, name):
    hw = parse_cpuinfo(text)
    assert (hw.type, hw.vendor, hw.vendor_id, hw.device_id) == (
        HardwareDeviceType.CPU,
        vendor,
        vendor_id,
        device_id,
    )
    assert hw.metadata.get("model_name") == name
    assert not hw.is_virtual


def test_this_machines_cpu_is_discovered():
    hw = cpu_device()
    assert hw.type == HardwareDeviceType.CPU and int(hw.metadata["cores"]) >= 1
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    if "GenuineIntel" in text:
        assert hw.vendor_id == 0x8086
    elif "AuthenticAMD" in text:
        assert hw.vendor_id == 0x1022
    assert registry.discover_hardware()[0] == hw


def test_builtin_eps_found_by_folder_serve_the_cpu():
    names = [d.name for d in registry.builtin_declarations()]
    assert {"CPUExecutionProvider", "ExampleExecutionProvider"} <= set(names)
    devices = epctx.get_ep_devices()
    assert devices[-1].ep_name == "CPUExecutionProvider"
    cpu = registry.discover_hardware()[0]
    for ep in ("CPUExecutionProvider", "ExampleExecutionProvider"):
        assert [d.device for d in devices if d.ep_name == ep] == [cpu]
    assert not any(d.device.is_virtual for d in devices)


def test_openvino_reports_its_devices():
    ov = pytest.importorskip("openvino")
    devices = [d for d in epctx.get_ep_devices() if d.ep_name == "OpenVINOExecutionProvider"]
    available = ov.Core().available_devices
    assert sorted(d.ep_options["device_type"] for d in devices) == sorted(
        n for n in available if n.split(".")[0] in ("CPU", "GPU", "NPU")
    )
    for d in devices:
        kind = d.ep_options["device_type"].split(".")[0]
        assert d.device.type == HardwareDeviceType[kind]


def test_import_epctx_stays_light():
    code = (
        "import sys, epctx, epctx.providers.openvino, epctx.providers.cpu; "
        "epctx.get_available_providers(); "
        "print(sorted(m for m in ('openvino', 'onnx', 'onnx_ir', 'epctx.providers.registry') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['epctx.providers.registry']"
