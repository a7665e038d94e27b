"""The OpenVINO EP's compatibility verdicts on a real context: optimal here, another OpenVINO release
unsupported (session refused with the same text), another CPU model or device type judged as such."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

pytest.importorskip("openvino")

import epctx
from epctx.cache.compatibility import validate_for_ep, validate_for_ep_devices
from epctx.cache.verdicts import check_model
from epctx.providers.openvino import compatibility
from epctx.testing import no_compile
from epctx.testing.conformance import models

EP = "OpenVINOExecutionProvider"
Compat = epctx.OrtCompiledModelCompatibility


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ov_verdicts")
    onnx.save(models.chain(), folder / "model.onnx")
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    epctx.InferenceSession(str(folder / "model.onnx"), so, providers=[EP])
    return folder / "model_ctx.onnx"


def _info(ctx: Path) -> str:
    info = epctx.get_compatibility_info_from_model(ctx, EP)
    assert info is not None
    return info


def test_the_string_names_release_device_cpu_and_precision(ctx: Path) -> None:
    import openvino as ov

    fields = dict(item.split("=", 1) for item in _info(ctx).split(";"))
    assert fields["sdk"] == f"openvino-{ov.get_version()}"
    assert fields["device"] == "CPU" and fields["precision"] == "f32" and fields["weightless"] == "0"
    core = ov.Core()
    assert fields["name"] == core.get_property("CPU", "FULL_DEVICE_NAME")
    assert fields["architecture"] == core.get_property("CPU", "DEVICE_ARCHITECTURE")
    assert compatibility.openvino_release() == ov.get_version().split("-")[0]


def test_optimal_here(ctx: Path) -> None:
    devices = [d for d in epctx.get_ep_devices() if d.ep_name == EP]
    assert epctx.get_model_compatibility_for_ep_devices(devices, _info(ctx)) == Compat.EP_SUPPORTED_OPTIMAL
    assert check_model(ctx, EP).status == Compat.EP_SUPPORTED_OPTIMAL


def test_another_release_is_unsupported_and_refused(ctx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = compatibility.openvino_release()
    monkeypatch.setattr(compatibility, "openvino_release", lambda: "2099.1.0")
    verdict = validate_for_ep(EP, _info(ctx), [])
    assert verdict.status == Compat.EP_UNSUPPORTED
    assert verdict.reasons == (f"compiled by OpenVINO {made}, this is OpenVINO 2099.1.0",)
    with pytest.raises(epctx.InvalidGraph) as refused, no_compile():
        epctx.InferenceSession(str(ctx), providers=[EP])
    assert verdict.explain() in str(refused.value)


def test_another_cpu_model_prefers_recompilation_another_device_type_is_unsupported(ctx: Path) -> None:
    info = _info(ctx)
    name = dict(item.split("=", 1) for item in info.split(";"))["name"]
    verdict = validate_for_ep(EP, info.replace(f"name={name}", "name=Some Other CPU"), [])
    assert verdict.status == Compat.EP_SUPPORTED_PREFER_RECOMPILATION
    assert verdict.reasons[0].startswith(f"compiled on CPU 'Some Other CPU', this CPU is {name!r}")
    gpu = epctx.OrtHardwareDevice(epctx.OrtHardwareDeviceType.GPU, 0x8086, 1, "Intel", {})
    verdict = validate_for_ep(EP, info, [gpu])
    assert verdict.status == Compat.EP_UNSUPPORTED
    assert verdict.reasons == ("compiled for OpenVINO device CPU, the device is a GPU",)
    devices = [d for d in epctx.get_ep_devices() if d.ep_name == EP]
    not_ov = validate_for_ep_devices(devices, "sdk=iree-3.13.0;triple=x")
    assert (
        not_ov.status == Compat.EP_UNSUPPORTED and "not an OpenVINO compatibility string" in not_ov.reasons[0]
    )
