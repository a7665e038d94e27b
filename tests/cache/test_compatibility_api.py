"""onnxruntime's compiled model compatibility API in epctx: same names, values and semantics, called side by
side with onnxruntime's own functions where both can answer; the Example EP's verdicts; a session's verdict."""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
import onnxruntime as ort
import onnxruntime.capi.onnxruntime_pybind11_state as ort_capi
import pytest

import epctx
from epctx.testing import no_compile
from tests.epcontext.models import EXAMPLE, feed, two_partition_model

KEY = f"ep_compatibility_info.{EXAMPLE}"


@pytest.fixture(scope="module")
def example_ctx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("example_ctx")
    src = folder / "model.onnx"
    onnx.save(two_partition_model(), src)
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    epctx.InferenceSession(str(src), so, providers=[EXAMPLE])
    return folder / "model_ctx.onnx"


def test_enums_have_onnxruntimes_names_and_values() -> None:
    for ours, theirs in (
        (epctx.OrtCompiledModelCompatibility, ort_capi.OrtCompiledModelCompatibility),
        (epctx.OrtDeviceEpIncompatibilityReason, ort_capi.OrtDeviceEpIncompatibilityReason),
    ):
        assert {m.name: int(m) for m in ours} == {n: int(v) for n, v in theirs.__members__.items()}
        assert str(next(iter(ours))) == str(next(iter(theirs.__members__.values())))


def test_info_from_model_side_by_side_with_onnxruntime(example_ctx: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain.onnx"
    onnx.save(two_partition_model(), plain)
    for path in (example_ctx, plain):
        for ep in (EXAMPLE, "CPUExecutionProvider", "NoSuchEP"):
            theirs = ort_capi.get_compatibility_info_from_model(str(path), ep)
            assert epctx.get_compatibility_info_from_model(str(path), ep) == theirs
            data = path.read_bytes()
            assert epctx.get_compatibility_info_from_model_bytes(data, ep) == theirs
            assert epctx.get_compatibility_info_from_model_bytes(memoryview(bytearray(data)), ep) == theirs
    info = epctx.get_compatibility_info_from_model(example_ctx, EXAMPLE)
    assert info is not None and info.startswith("sdk=example-")  # the one epctx wrote at compile


def test_info_from_model_errors_where_onnxruntime_errs(tmp_path: Path, example_ctx: Path) -> None:
    cases = [
        (lambda f: f(str(tmp_path / "missing.onnx"), EXAMPLE)),
        (lambda f: f("", EXAMPLE)),
        (lambda f: f(str(example_ctx), "")),
    ]
    for call in cases:
        with pytest.raises(RuntimeError):
            call(ort_capi.get_compatibility_info_from_model)
        with pytest.raises(RuntimeError):
            call(epctx.get_compatibility_info_from_model)
    for data, ep in ((b"this is not a valid ONNX model", EXAMPLE), (b"", EXAMPLE), (b"data", "")):
        with pytest.raises(RuntimeError):
            ort_capi.get_compatibility_info_from_model_bytes(data, ep)
        with pytest.raises(RuntimeError):
            epctx.get_compatibility_info_from_model_bytes(data, ep)


def test_model_compatibility_for_cpu_devices_side_by_side() -> None:
    ort_cpu = [d for d in ort_capi.get_ep_devices() if d.ep_name == "CPUExecutionProvider"][:1]
    ours = [d for d in epctx.get_ep_devices() if d.ep_name == "CPUExecutionProvider"][:1]
    assert ours and ort_cpu
    theirs = ort_capi.get_model_compatibility_for_ep_devices(ort_cpu, "arbitrary-compat-string")
    found = epctx.get_model_compatibility_for_ep_devices(ours, "arbitrary-compat-string")
    assert found.name == theirs.name == "EP_NOT_APPLICABLE"
    with pytest.raises(RuntimeError):
        ort_capi.get_model_compatibility_for_ep_devices([], "info")
    with pytest.raises(RuntimeError):
        epctx.get_model_compatibility_for_ep_devices([], "info")
    with pytest.raises(TypeError):
        epctx.get_model_compatibility_for_ep_devices(ours, None)  # type: ignore[arg-type]


def test_devices_of_two_eps_are_refused() -> None:
    devices = epctx.get_ep_devices()
    mixed = [next(d for d in devices if d.ep_name == n) for n in ("CPUExecutionProvider", EXAMPLE)]
    with pytest.raises(epctx.InvalidArgument, match="same execution provider"):
        epctx.get_model_compatibility_for_ep_devices(mixed, "x")


def test_hardware_device_details_side_by_side() -> None:
    (ort_cpu,) = [d for d in ort_capi.get_hardware_devices() if d.type.value == 0][:1]
    theirs = ort_capi.get_hardware_device_ep_incompatibility_details("CPUExecutionProvider", ort_cpu)
    cpu = next(d.device for d in epctx.get_ep_devices() if d.ep_name == "CPUExecutionProvider")
    ours = epctx.get_hardware_device_ep_incompatibility_details("CPUExecutionProvider", cpu)
    assert set(ours) == set(theirs) == {"reasons_bitmask", "notes", "error_code"}
    assert ours["reasons_bitmask"] == theirs["reasons_bitmask"] == 0
    assert ours["error_code"] == theirs["error_code"] == 0
    with pytest.raises(Exception, match="INVALID_ARGUMENT"):
        ort_capi.get_hardware_device_ep_incompatibility_details("", ort_cpu)
    with pytest.raises(RuntimeError):
        epctx.get_hardware_device_ep_incompatibility_details("", cpu)


def test_hardware_device_details_name_a_device_iree_cannot_use() -> None:
    pytest.importorskip("iree.runtime")
    gpu = epctx.OrtHardwareDevice(epctx.OrtHardwareDeviceType.GPU, 0x8086, 1, "Intel", {})
    details = epctx.get_hardware_device_ep_incompatibility_details("IREEExecutionProvider", gpu)
    assert details["reasons_bitmask"] == int(epctx.OrtDeviceEpIncompatibilityReason.DEVICE_INCOMPATIBLE)
    assert "CPUs" in details["notes"] and "GPU" in details["notes"]


def test_example_ep_verdicts_explained(example_ctx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = epctx.get_compatibility_info_from_model(example_ctx, EXAMPLE)
    assert info is not None
    devices = [d for d in epctx.get_ep_devices() if d.ep_name == EXAMPLE]
    Compat = epctx.OrtCompiledModelCompatibility
    assert epctx.get_model_compatibility_for_ep_devices(devices, info) == Compat.EP_SUPPORTED_OPTIMAL
    # Another epctx that runs the same program format still loads it (the EP knows its binary still loads).
    other = info.replace(f"example-{epctx.__version__}/", "example-0.0.1/")
    from epctx.cache.compatibility import validate_for_ep_devices

    verdict = validate_for_ep_devices(devices, other)
    assert verdict.status == Compat.EP_SUPPORTED_OPTIMAL
    assert verdict.reasons == (
        f"made by epctx 0.0.1, this is {epctx.__version__}: the program format 1 is the same",
    )
    import epctx.providers.example.provider as example

    monkeypatch.setattr(example, "PROGRAM_VERSION", 2)
    verdict = validate_for_ep_devices(devices, info)
    assert verdict.status == Compat.EP_UNSUPPORTED
    assert "program format '1', this ExampleExecutionProvider runs format 2" in verdict.explain()
    assert "recompile" in verdict.advice


def test_session_refusal_carries_the_verdict_text(example_ctx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import epctx.providers.example.provider as example

    monkeypatch.setattr(example, "PROGRAM_VERSION", 2)
    with pytest.raises(epctx.InvalidGraph) as info, no_compile():
        epctx.InferenceSession(str(example_ctx), providers=[EXAMPLE])
    from epctx.cache.verdicts import check_model

    (node, *_) = check_model(example_ctx).nodes
    assert node.verdict.explain() in str(info.value)
    assert "UNSUPPORTED: program format '1'" in str(info.value) and "what to do: recompile" in str(info.value)


def test_a_replaced_binary_is_unsupported_naming_both_versions(tmp_path: Path, example_ctx: Path) -> None:
    model = onnx.load(example_ctx)
    for prop in model.metadata_props:
        if prop.key == KEY:
            prop.value = prop.value.replace(f"example-{epctx.__version__}", "example-9.9.9")
    for name in ("model_ctx.onnx", f"model_{EXAMPLE}.bin"):
        if name.endswith(".bin"):
            (tmp_path / name).write_bytes((example_ctx.parent / name).read_bytes())
    onnx.save(model, tmp_path / "model_ctx.onnx")
    from epctx.cache.verdicts import check_model

    verdict = check_model(tmp_path / "model_ctx.onnx")
    assert verdict.status == epctx.OrtCompiledModelCompatibility.EP_UNSUPPORTED
    text = "\n".join(verdict.lines())
    assert (
        f"the binary was made by example-{epctx.__version__}" in text
        and "metadata says example-9.9.9" in text
    )


def test_a_plugin_ep_class_gets_the_same_hooks(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from epctx.ep import CompatibilityVerdict
    from epctx.providers.example.provider import ExampleExecutionProvider
    from epctx.providers.registry import _REGISTERED, register_provider_class

    class Picky(ExampleExecutionProvider):
        name = "PickyExecutionProvider"
        sources = ("PickyExecutionProvider",)

        def compatibility_info(self) -> str:
            return "picky;level=2"

        @classmethod
        def validate_compatibility_info(cls, info, devices):  # type: ignore[no-untyped-def]
            if info.endswith("level=2"):
                return CompatibilityVerdict.prefer_recompilation(
                    "level 2 -> 3", advice="recompile at level 3"
                )
            return CompatibilityVerdict.unsupported("unknown level")

    register_provider_class(Picky)
    try:
        src = tmp_path / "model.onnx"
        onnx.save(two_partition_model(), src)
        so = epctx.SessionOptions()
        so.add_session_config_entry("ep.context_enable", "1")
        epctx.InferenceSession(str(src), so, providers=["PickyExecutionProvider"])
        ctx = tmp_path / "model_ctx.onnx"
        assert epctx.get_compatibility_info_from_model(ctx, "PickyExecutionProvider") == "picky;level=2"
        devices = [d for d in epctx.get_ep_devices() if d.ep_name == "PickyExecutionProvider"]
        assert epctx.get_model_compatibility_for_ep_devices(devices, "picky;level=2").name == (
            "EP_SUPPORTED_PREFER_RECOMPILATION"
        )
        with caplog.at_level(logging.WARNING, logger="epctx"), no_compile():
            sess = epctx.InferenceSession(str(ctx), providers=["PickyExecutionProvider"])
        assert sess.run(None, feed())[0].shape == (3, 4)
        assert "suboptimal" in caplog.text and "level 2 -> 3" in caplog.text
        so = epctx.SessionOptions()
        so.add_session_config_entry("session.fail_on_suboptimal_compiled_model", "1")
        with pytest.raises(epctx.Fail, match="level 2 -> 3.*recompile at level 3"), no_compile():
            epctx.InferenceSession(str(ctx), so, providers=["PickyExecutionProvider"])
    finally:
        _REGISTERED.pop("PickyExecutionProvider", None)


def test_fail_on_suboptimal_is_a_checked_flag() -> None:
    so = epctx.SessionOptions()
    with pytest.raises(epctx.InvalidArgument):
        so.add_session_config_entry("session.fail_on_suboptimal_compiled_model", "yes")
    assert ort.SessionOptions  # the key is onnxruntime's (kOrtSessionOptionsFailOnSuboptimalCompiledModel)
