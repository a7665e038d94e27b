"""The IREE EP's compatibility verdicts on real contexts compiled for this CPU, for x86-64-v2 and for aarch64:
per device (this CPU, and the IREE library's virtual CPUs), through the public API, the session and the CLI."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime.capi.onnxruntime_pybind11_state as ort_capi
import pytest

import epctx
from epctx.cache.compatibility import validate_for_ep_devices
from epctx.cache.verdicts import check_model
from epctx.providers.iree import compatibility
from epctx.providers.iree.targets import PRESETS, host_features
from epctx.testing import no_compile
from epctx.testing.conformance import models
from tests.oracle import run_ort
from tests.requires import requires

# Compiles with IREE: `make test-fast` leaves it out.
pytestmark = [pytest.mark.slow, requires("iree.runtime", "iree.compiler")]

EP = "IREEExecutionProvider"
Compat = epctx.OrtCompiledModelCompatibility
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def contexts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The chain model compiled by IREE for three targets: target name -> context model."""
    folder = tmp_path_factory.mktemp("iree_verdicts")
    found = {}
    for target in ("host", "x86-64-v2", "aarch64"):
        src = folder / f"{target}.onnx"
        onnx.save(models.chain(), src)
        so = epctx.SessionOptions()
        so.add_session_config_entry("ep.context_enable", "1")
        epctx.InferenceSession(str(src), so, providers=[(EP, {"target": target})])
        found[target] = folder / f"{target}_ctx.onnx"
    return found


def _iree_devices() -> list[epctx.OrtEpDevice]:
    return [d for d in epctx.get_ep_devices() if d.ep_name == EP]


def _feeds() -> dict[str, np.ndarray]:
    model = models.chain()
    (value,) = model.graph.input
    shape = [d.dim_value or 1 for d in value.type.tensor_type.shape.dim]
    return {value.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}


def test_the_string_written_at_compile_names_sdk_target_and_options(contexts: dict[str, Path]) -> None:
    info = epctx.get_compatibility_info_from_model(contexts["x86-64-v2"], EP)
    assert info == ort_capi.get_compatibility_info_from_model(
        str(contexts["x86-64-v2"]), EP
    )  # onnxruntime agrees
    fields = dict(item.split("=", 1) for item in (info or "").split(";"))
    assert fields["sdk"] == f"iree-{compatibility.iree_version()}"
    assert fields["triple"] == "x86_64-unknown-linux-gnu" and fields["target"] == "x86-64-v2"
    assert set(fields["features"].split(",")) == set(PRESETS["x86-64-v2"].features)
    assert (fields["opt_level"], fields["channels_last"], fields["flags"]) == ("O2", "1", "")


def test_host_context_is_optimal_here(contexts: dict[str, Path]) -> None:
    info = epctx.get_compatibility_info_from_model(contexts["host"], EP)
    assert info is not None
    assert epctx.get_model_compatibility_for_ep_devices(_iree_devices(), info) == Compat.EP_SUPPORTED_OPTIMAL
    verdict = check_model(contexts["host"])
    assert verdict.status == Compat.EP_SUPPORTED_OPTIMAL and not verdict.findings
    assert [d.device.startswith("CPU ") for n in verdict.nodes for d in n.devices] == [True]


def test_x86_64_v2_context_on_a_richer_cpu_prefers_recompilation(
    contexts: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    unused = sorted(host_features() - PRESETS["x86-64-v2"].features)
    if not unused:
        pytest.skip("this CPU has nothing beyond x86-64-v2")
    info = epctx.get_compatibility_info_from_model(contexts["x86-64-v2"], EP) or ""
    verdict = validate_for_ep_devices(_iree_devices(), info)
    assert verdict.status == Compat.EP_SUPPORTED_PREFER_RECOMPILATION
    (reason,) = verdict.reasons
    assert reason.startswith("compiled for target x86-64-v2") and ", ".join(unused) in reason
    assert "target=host" in verdict.advice
    # It runs (a warning says why it could run faster), and runs right ...
    with caplog.at_level(logging.WARNING, logger="epctx"), no_compile():
        sess = epctx.InferenceSession(str(contexts["x86-64-v2"]), providers=[EP])
    assert "suboptimal" in caplog.text and reason in caplog.text
    feeds = _feeds()
    np.testing.assert_allclose(sess.run(None, feeds)[0], run_ort(models.chain(), feeds)[0], atol=1e-5)
    # ... unless the session says it must not run suboptimal code (onnxruntime's option).
    so = epctx.SessionOptions()
    so.add_session_config_entry("session.fail_on_suboptimal_compiled_model", "1")
    with pytest.raises(epctx.Fail, match="suboptimal") as refused, no_compile():
        epctx.InferenceSession(str(contexts["x86-64-v2"]), so, providers=[EP])
    assert verdict.explain() in str(refused.value)


def test_aarch64_context_is_unsupported_here_with_the_same_text_as_check(contexts: dict[str, Path]) -> None:
    info = epctx.get_compatibility_info_from_model(contexts["aarch64"], EP) or ""
    verdict = validate_for_ep_devices(_iree_devices(), info)
    assert verdict.status == Compat.EP_UNSUPPORTED
    assert verdict.reasons == (
        "compiled for aarch64-unknown-linux-gnu, this CPU is x86_64-unknown-linux-gnu",
    )
    with pytest.raises(epctx.InvalidGraph) as refused, no_compile():
        epctx.InferenceSession(str(contexts["aarch64"]), providers=[EP])
    (node,) = check_model(contexts["aarch64"]).nodes
    assert node.verdict.explain() in str(refused.value)


def test_another_iree_release_is_unsupported(
    contexts: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    made = compatibility.iree_version()
    monkeypatch.setattr(compatibility, "iree_version", lambda: "99.1.0")
    verdict = check_model(contexts["host"])
    assert verdict.status == Compat.EP_UNSUPPORTED
    text = "\n".join(verdict.lines())
    assert f"compiled by IREE {made}, this is IREE 99.1.0" in text
    assert "load only in the release that compiled them" in text
    with (
        pytest.raises(epctx.InvalidGraph, match=f"compiled by IREE {made}, this is IREE 99.1.0"),
        no_compile(),
    ):
        epctx.InferenceSession(str(contexts["host"]), providers=[EP])


def test_virtual_devices_are_judged_as_their_target(contexts: dict[str, Path]) -> None:
    epctx.register_execution_provider_library("iree_verdicts.virtual", "epctx.providers.iree.library")
    try:
        devices = {d.device.metadata.get("target", "here"): d for d in _iree_devices()}
        arm = epctx.get_compatibility_info_from_model(contexts["aarch64"], EP) or ""
        assert (
            epctx.get_model_compatibility_for_ep_devices([devices["aarch64"]], arm)
            == Compat.EP_SUPPORTED_OPTIMAL
        )
        assert epctx.get_model_compatibility_for_ep_devices([devices["here"]], arm) == Compat.EP_UNSUPPORTED
        # Several devices: the worst verdict.
        both = [devices["aarch64"], devices["here"]]
        assert epctx.get_model_compatibility_for_ep_devices(both, arm) == Compat.EP_UNSUPPORTED
        host = epctx.get_compatibility_info_from_model(contexts["host"], EP) or ""
        beyond_v2 = sorted(host_features() - PRESETS["x86-64-v2"].features)
        if beyond_v2:
            verdict = validate_for_ep_devices([devices["x86-64-v2"]], host)
            assert verdict.status == Compat.EP_UNSUPPORTED
            assert verdict.reasons[0].startswith(
                f"needs {', '.join(beyond_v2)} which the virtual x86-64-v2 CPU lacks"
            )
        rows = {d.device: d.verdict.status for n in check_model(contexts["aarch64"]).nodes for d in n.devices}
        assert rows["CPU IREE (virtual, target aarch64)"] == Compat.EP_SUPPORTED_OPTIMAL
        assert sum(s == Compat.EP_UNSUPPORTED for s in rows.values()) >= len(rows) - 2  # riscv64, x86 targets
    finally:
        epctx.unregister_execution_provider_library("iree_verdicts.virtual")


def test_a_context_without_the_metadata_is_judged_on_its_binary_header(
    contexts: dict[str, Path], tmp_path: Path
) -> None:
    for name in ("aarch64_ctx.onnx", f"aarch64_{EP}.bin"):
        (tmp_path / name).write_bytes((contexts["aarch64"].parent / name).read_bytes())
    model = onnx.load(tmp_path / "aarch64_ctx.onnx")
    kept = [p for p in model.metadata_props if not p.key.startswith("ep_compatibility_info.")]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    onnx.save(model, tmp_path / "aarch64_ctx.onnx")
    assert epctx.get_compatibility_info_from_model(tmp_path / "aarch64_ctx.onnx", EP) is None
    (node,) = check_model(tmp_path / "aarch64_ctx.onnx").nodes
    assert not node.from_metadata and node.verdict.status == Compat.EP_UNSUPPORTED
    assert node.verdict.reasons == (
        "compiled for aarch64-unknown-linux-gnu, this CPU is x86_64-unknown-linux-gnu",
    )


def test_the_verdict_imports_no_backend(contexts: dict[str, Path]) -> None:
    """Neither IREE nor OpenVINO nor onnx: the model's metadata, nodes and binary headers only (listing every
    EP's devices with get_ep_devices() is another matter: OpenVINO discovers its GPUs and NPUs)."""
    script = textwrap.dedent(
        f"""
        import sys, epctx
        from epctx.cache.compatibility import validate_for_ep
        from epctx.cache.verdicts import check_model
        info = epctx.get_compatibility_info_from_model({str(contexts["aarch64"])!r}, {EP!r})
        assert validate_for_ep({EP!r}, info, []).status.name == "EP_UNSUPPORTED"
        assert check_model({str(contexts["x86-64-v2"])!r}).findings
        print(sorted(m for m in sys.modules if m.startswith(("iree.", "openvino", "onnx", "torch"))))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
