"""Plugin EP libraries: registered by path, by module name and by entry point, listed by get_ep_devices(),
used by a session and by ModelCompiler, unregistered; every error; the seeds' two plugin examples."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import epctx
from epctx.errors import Fail, InvalidArgument, NoSuchFile
from epctx.providers import registry

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "plugin_ep"
LIBRARY = FIXTURES / "plugin_ep.py"
EP = "ContosoExecutionProvider"

sys.path.insert(0, str(FIXTURES))
from make_models import make_model, reference  # noqa: E402


@pytest.fixture
def library(request):
    """Registers the fixture library (by path) under a fresh name; unregisters it afterwards."""
    names = []

    def register(name: str = "contoso", path: str | os.PathLike[str] = LIBRARY) -> str:
        epctx.register_execution_provider_library(name, path)
        names.append(name)
        return name

    yield register
    gc.collect()
    for name in names:
        if name in registry.registered_libraries():
            epctx.unregister_execution_provider_library(name)


def _x() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)


@pytest.mark.slow
def test_registered_by_path_lists_its_devices_and_runs_a_session(library, tmp_path):
    library()
    devices = [d for d in epctx.get_ep_devices() if d.ep_name == EP]
    assert [d.device.type for d in devices] == [epctx.OrtHardwareDeviceType.CPU]
    assert not any(d.device.is_virtual for d in devices)  # not allowed virtual devices
    assert EP in epctx.get_available_providers()
    model = make_model(str(tmp_path / "m.onnx"), extra_op="Sigmoid")
    sess = epctx.InferenceSession(model, providers=[EP])
    assert sess.get_providers() == [EP, "CPUExecutionProvider"]
    assert [ep for ep, _ in sess.get_partitions()] == [EP, "CPUExecutionProvider"]
    (y,) = sess.run(None, {"x": _x()})
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-reference(0, _x()))), rtol=1e-6)


@pytest.mark.slow
def test_add_provider_for_devices_and_model_compiler_round_trip(library, tmp_path):
    library()
    device = next(d for d in epctx.get_ep_devices() if d.ep_name == EP)
    so = epctx.SessionOptions()
    so.add_provider_for_devices([device], {"ops": "Relu,Add,Mul"})
    model = make_model(str(tmp_path / "m.onnx"))
    out = tmp_path / "m_ctx.onnx"
    epctx.ModelCompiler(so, model).compile_to_file(str(out))
    assert [p.name for p in tmp_path.glob("*.bin")] == [f"m_{EP}.bin"]
    sess = epctx.InferenceSession(str(out), providers=[EP])
    assert [ep for ep, _ in sess.get_partitions()] == [EP]
    (y,) = sess.run(None, {"x": _x()})
    np.testing.assert_allclose(y, reference(0, _x()), rtol=1e-6)
    # the session options' providers are honoured by InferenceSession too
    sess2 = epctx.InferenceSession(model, so)
    assert sess2.get_providers() == [EP, "CPUExecutionProvider"]


@pytest.mark.slow
def test_virtual_devices_only_for_a_virtual_registration(library):
    library("contoso.virtual")
    virtual = [d for d in epctx.get_ep_devices() if d.ep_name == EP and d.device.is_virtual]
    assert len(virtual) == 1
    assert virtual[0].device.metadata["is_virtual"] == "1"
    assert virtual[0].device.type == epctx.OrtHardwareDeviceType.GPU
    assert dict(virtual[0].ep_options) == {"compile_optimization": "O3"}


@pytest.mark.slow
def test_registered_by_module_name(library, monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    library("contoso_mod", "plugin_ep")
    assert registry.registered_libraries()["contoso_mod"] == [EP]


@pytest.mark.slow
def test_unregister_refused_while_a_session_holds_its_ep(library, tmp_path):
    name = library()
    sess = epctx.InferenceSession(make_model(str(tmp_path / "m.onnx")), providers=[EP])
    with pytest.raises(Fail, match=r"contoso.*still in use.*ContosoExecutionProvider"):
        epctx.unregister_execution_provider_library(name)
    del sess
    epctx.unregister_execution_provider_library(name)
    assert EP not in epctx.get_available_providers()
    with pytest.raises(InvalidArgument, match="ContosoExecutionProvider"):
        epctx.InferenceSession(make_model(str(tmp_path / "m.onnx")), providers=[EP])


@pytest.mark.slow
def test_unregister_refused_while_a_model_compiler_compiles(library, tmp_path):
    name = library()
    so = epctx.SessionOptions()
    so.add_provider(EP, {"ops": "Relu"})  # Mul and Add stay on the CPU: their weights stay in the model
    seen = []

    def location(init_name, value, info):
        try:
            epctx.unregister_execution_provider_library(name)
        except Fail as exc:
            seen.append(str(exc))
        return None

    compiler = epctx.ModelCompiler(
        so, make_model(str(tmp_path / "m.onnx")), get_initializer_location_func=location
    )
    compiler.compile_to_file(str(tmp_path / "out.onnx"))
    assert seen and "still in use" in seen[0]
    epctx.unregister_execution_provider_library(name)  # the compile is over: its EPs are released
    with pytest.raises(InvalidArgument, match="not registered|unknown"):
        compiler.compile_to_file(str(tmp_path / "out2.onnx"))


@pytest.mark.slow
def test_errors(library, tmp_path):
    library()
    with pytest.raises(InvalidArgument, match="already registered as 'contoso'"):
        epctx.register_execution_provider_library("contoso", LIBRARY)
    with pytest.raises(NoSuchFile, match="nope.py"):
        epctx.register_execution_provider_library("x", tmp_path / "nope.py")
    with pytest.raises(NoSuchFile, match="no_such_module_xyz"):
        epctx.register_execution_provider_library("x", "no_such_module_xyz")
    with pytest.raises(InvalidArgument, match="no create_ep_factories"):
        epctx.register_execution_provider_library("x", FIXTURES / "bad_no_factories.py")
    with pytest.raises(InvalidArgument, match="returned no EP factories"):
        epctx.register_execution_provider_library("x", FIXTURES / "bad_empty.py")
    with pytest.raises(InvalidArgument, match="exists already"):  # the same EP name twice
        epctx.register_execution_provider_library("contoso2", LIBRARY)
    with pytest.raises(InvalidArgument, match="no EP library is registered as 'ghost'"):
        epctx.unregister_execution_provider_library("ghost")
    assert "x" not in registry.registered_libraries()


def test_entry_point(tmp_path, monkeypatch):
    dist = tmp_path / "contoso_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: contoso-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\ncontoso_ep = plugin_ep\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(FIXTURES))
    registry._reset_for_tests()
    try:
        assert registry.registered_libraries()["contoso_ep"] == [EP]
        assert any(d.ep_name == EP for d in epctx.get_ep_devices())
        sess = epctx.InferenceSession(make_model(str(tmp_path / "m.onnx")), providers=[EP])
        assert sess.get_providers()[0] == EP
        del sess
        epctx.unregister_execution_provider_library("contoso_ep")
    finally:
        monkeypatch.undo()
        registry._reset_for_tests()
    assert EP not in epctx.get_available_providers()


@pytest.mark.slow
@pytest.mark.parametrize("script", ["cross_compile.py", "weight_sharing.py"])
def test_seed_examples_run_with_import_epctx_as_ort(script, tmp_path):
    done = subprocess.run(
        [sys.executable, str(FIXTURES / script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    if script == "weight_sharing.py":
        assert sorted(p.name for p in tmp_path.glob("*.bin")) == [f"output_model_0_{EP}.bin"]
