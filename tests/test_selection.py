"""Provider selection: the one normaliser, SessionOptions.add_provider honoured by sessions, the seven
policies on fixed device lists, the selection delegate, and the command line's -p."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import epctx
from epctx.cli import main as cli_main
from epctx.ep import EpDevice, HardwareDevice
from epctx.ep import ExecutionProviderDevicePolicy as Policy
from epctx.ep import HardwareDeviceType as T
from epctx.errors import Fail, InvalidArgument
from epctx.providers.selection import normalize_providers, parse_provider_spec, select_ep_devices

CPU = HardwareDevice(T.CPU, 0x8086, 0, "Intel", {"model_name": "Core"})
IGPU = HardwareDevice(T.GPU, 0x8086, 0x46A6, "Intel", {"Discrete": "0"})
DGPU = HardwareDevice(T.GPU, 0x10DE, 0x2684, "NVIDIA", {"Discrete": "1"})
NPU = HardwareDevice(T.NPU, 0x8086, 0x7D1D, "Intel", {})
VGPU = HardwareDevice(T.GPU, 0xC057, 0, "Contoso", {"is_virtual": "1"})


def dev(ep: str, hw: HardwareDevice) -> EpDevice:
    return EpDevice(ep, "v", {}, {}, hw)


OV_CPU, OV_IGPU, OV_NPU = dev("OV", CPU), dev("OV", IGPU), dev("OV", NPU)
CUDA_DGPU, VIRT = dev("CUDA", DGPU), dev("Contoso", VGPU)
CPU_EP = dev("CPUExecutionProvider", CPU)

FULL = [
    CPU_EP,
    OV_CPU,
    OV_IGPU,
    OV_NPU,
    CUDA_DGPU,
    VIRT,
]  # CPU, integrated + discrete GPU, NPU, a virtual GPU
CPU_ONLY = [CPU_EP, OV_CPU]
GPU_ONLY = [CPU_EP, OV_IGPU]  # a GPU, no NPU, no other EP on the CPU
NPU_ONLY = [CPU_EP, OV_NPU]


@pytest.mark.parametrize(
    ("policy", "devices", "expected"),
    [
        # DEFAULT is PREFER_CPU: the first CPU device, another EP before the CPU EP
        (Policy.DEFAULT, FULL, [OV_CPU]),
        (Policy.PREFER_CPU, FULL, [OV_CPU]),
        (Policy.PREFER_CPU, [CPU_EP], [CPU_EP]),
        # PREFER_GPU / MAX_PERFORMANCE: the first GPU (discrete before integrated), then the CPU pick
        (Policy.PREFER_GPU, FULL, [CUDA_DGPU, OV_CPU]),
        (Policy.MAX_PERFORMANCE, FULL, [CUDA_DGPU, OV_CPU]),
        (Policy.PREFER_GPU, GPU_ONLY, [OV_IGPU, CPU_EP]),
        (Policy.PREFER_GPU, CPU_ONLY, [OV_CPU]),
        (Policy.PREFER_GPU, NPU_ONLY, [CPU_EP]),
        # PREFER_NPU / MAX_EFFICIENCY / MIN_OVERALL_POWER: the first NPU, then the CPU pick
        (Policy.PREFER_NPU, FULL, [OV_NPU, OV_CPU]),
        (Policy.MAX_EFFICIENCY, FULL, [OV_NPU, OV_CPU]),
        (Policy.MIN_OVERALL_POWER, FULL, [OV_NPU, OV_CPU]),
        (Policy.PREFER_NPU, GPU_ONLY, [CPU_EP]),
        (Policy.PREFER_NPU, CPU_ONLY, [OV_CPU]),
        (Policy.MIN_OVERALL_POWER, NPU_ONLY, [OV_NPU, CPU_EP]),
        # a virtual device is never picked by a policy
        (Policy.PREFER_GPU, [CPU_EP, VIRT], [CPU_EP]),
    ],
)
def test_policies_pick_the_documented_devices(policy, devices, expected):
    assert select_ep_devices(policy, devices) == expected


def test_every_policy_is_covered():
    assert len(Policy) == 7
    assert epctx.OrtExecutionProviderDevicePolicy is Policy


def _model(path, metadata=None):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for key, value in (metadata or {}).items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(path))
    return str(path)


def test_policy_applies_when_no_providers_are_given(tmp_path):
    so = epctx.SessionOptions()
    so.set_provider_selection_policy(epctx.OrtExecutionProviderDevicePolicy.PREFER_CPU)
    sess = epctx.InferenceSession(_model(tmp_path / "m.onnx"), so)
    providers = sess.get_providers()
    assert providers[-1] == "CPUExecutionProvider"
    assert "ExampleExecutionProvider" not in providers  # EP_BY_POLICY = False
    expected = (
        "OpenVINOExecutionProvider"
        if "OpenVINOExecutionProvider" in epctx.get_available_providers()
        else None
    )
    assert providers[0] == (expected or "CPUExecutionProvider")
    with pytest.raises(InvalidArgument, match="0..6"):
        so.set_provider_selection_policy(9)


def test_delegate_gets_the_documented_arguments_and_its_choice_is_honoured(tmp_path):
    calls = []

    def delegate(ep_devices, model_metadata, runtime_metadata, max_selections):
        calls.append((ep_devices, model_metadata, runtime_metadata, max_selections))
        return [d for d in ep_devices if d.ep_name == "ExampleExecutionProvider"]

    so = epctx.SessionOptions()
    so.set_provider_selection_policy_delegate(delegate)
    sess = epctx.InferenceSession(_model(tmp_path / "m.onnx", {"author": "me"}), so)
    (devices, model_metadata, runtime_metadata, max_selections) = calls[0]
    assert devices == epctx.get_ep_devices()
    assert all(isinstance(d, epctx.OrtEpDevice) for d in devices)
    assert model_metadata == {"author": "me"}
    assert runtime_metadata == {}
    assert max_selections == len(devices)
    assert sess.get_providers() == ["ExampleExecutionProvider", "CPUExecutionProvider"]
    assert sess.get_partitions()[0][0] == "ExampleExecutionProvider"


def test_delegate_errors(tmp_path):
    model = _model(tmp_path / "m.onnx")
    so = epctx.SessionOptions()
    so.set_provider_selection_policy_delegate(lambda d, m, r, n: [dev("Ghost", CPU)])
    with pytest.raises(InvalidArgument, match="not one of the EP devices"):
        epctx.InferenceSession(model, so)
    so.set_provider_selection_policy_delegate(lambda d, m, r, n: list(d) * 2)
    with pytest.raises(InvalidArgument, match="max_selections"):
        epctx.InferenceSession(model, so)

    def broken(*args):
        raise RuntimeError("boom")

    so.set_provider_selection_policy_delegate(broken)
    with pytest.raises(Fail, match="boom"):
        epctx.InferenceSession(model, so)


def test_add_provider_is_honoured_by_inference_session(tmp_path):
    so = epctx.SessionOptions()
    so.add_provider("ExampleExecutionProvider", {"ops": "Relu"})
    sess = epctx.InferenceSession(_model(tmp_path / "m.onnx"), so)
    assert sess.get_providers() == ["ExampleExecutionProvider", "CPUExecutionProvider"]
    assert sess.get_partitions()[0][0] == "ExampleExecutionProvider"
    with pytest.raises(InvalidArgument, match="one place"):
        epctx.InferenceSession(_model(tmp_path / "m.onnx"), so, providers=["CPUExecutionProvider"])


def test_add_provider_for_devices_of_a_builtin(tmp_path):
    device = next(d for d in epctx.get_ep_devices() if d.ep_name == "ExampleExecutionProvider")
    so = epctx.SessionOptions()
    so.add_provider_for_devices([device], {})
    assert so.providers == [("ExampleExecutionProvider", {})]
    sess = epctx.InferenceSession(_model(tmp_path / "m.onnx"), so)
    assert sess.get_providers()[0] == "ExampleExecutionProvider"
    with pytest.raises(InvalidArgument, match="one EP"):
        so.add_provider_for_devices([device, CPU_EP], {})
    with pytest.raises(InvalidArgument, match="non-empty"):
        so.add_provider_for_devices([], {})


def test_onnxruntime_only_provider_is_skipped_with_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="epctx"):
        sess = epctx.InferenceSession(_model(tmp_path / "m.onnx"), providers=["CUDAExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert "CUDAExecutionProvider" in caplog.text
    with pytest.raises(InvalidArgument, match="unknown execution provider 'NoSuchEP'"):
        epctx.InferenceSession(_model(tmp_path / "m.onnx"), providers=["NoSuchEP"])


def test_normaliser():
    assert normalize_providers(["A", ("B", {"k": 1})], [{}, {"j": True}]) == [
        ("A", {}),
        ("B", {"k": "1", "j": "True"}),
    ]
    with pytest.raises(InvalidArgument, match="twice"):
        normalize_providers(["A", "A"])
    with pytest.raises(InvalidArgument, match="provider_options has 1 entries for 2"):
        normalize_providers(["A", "B"], [{}])
    assert parse_provider_spec("EP") == ("EP", {})
    assert parse_provider_spec("EP:a=1, b = 2") == ("EP", {"a": "1", "b": "2"})
    assert parse_provider_spec('EP:disabled_ops="Gather,Softmax",x=1') == (
        "EP",
        {"disabled_ops": "Gather,Softmax", "x": "1"},
    )
    assert parse_provider_spec("EP:ops='Relu,Add'") == ("EP", {"ops": "Relu,Add"})
    for bad in ("EP:novalue", ":a=1", 'EP:a="open'):
        with pytest.raises(InvalidArgument):
            parse_provider_spec(bad)


def _run_json(capsys, *args):
    capsys.readouterr()
    assert cli_main(["run", *args, "--random", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_run_takes_provider_options(tmp_path, capsys):
    model = _model(tmp_path / "m.onnx")
    out = _run_json(capsys, model, "-p", "ExampleExecutionProvider:ops=Relu")
    assert out["providers"] == ["ExampleExecutionProvider", "CPUExecutionProvider"]
    out = _run_json(capsys, model, "-p", 'ExampleExecutionProvider:ops="Relu,Add"')
    assert out["providers"][0] == "ExampleExecutionProvider"
    out = _run_json(capsys, model, "-p", "ExampleExecutionProvider", "--option", "ops=Relu,Softmax")
    assert out["providers"][0] == "ExampleExecutionProvider"
    assert cli_main(["run", model, "-p", "ExampleExecutionProvider:ops=Nope"]) == 1
    assert "Nope" in capsys.readouterr().err


def test_cli_compile_with_repeated_option(tmp_path, capsys):
    model = _model(tmp_path / "m.onnx")
    args = ["compile", model, "-p", "ExampleExecutionProvider", "-O", "ops=Relu,Add", "-q"]
    assert cli_main(args) == 0
    assert (tmp_path / "m_ctx.onnx").exists()


def test_cli_devices(capsys):
    assert cli_main(["devices"]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:2] == ["EP", "EP"]
    assert "CPUExecutionProvider" in table
    assert cli_main(["devices", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["ep_name"] for r in rows] == [d.ep_name for d in epctx.get_ep_devices()]
    assert rows[-1]["ep_name"] == "CPUExecutionProvider"
    assert rows[-1]["device"]["type"] == "CPU"
    assert set(rows[0]["device"]) == {"type", "vendor_id", "device_id", "vendor", "metadata", "is_virtual"}
    np.testing.assert_equal(rows[-1]["device"]["is_virtual"], False)
