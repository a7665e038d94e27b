"""The sealed, versioned EP API (issue 17): ``epctx.ep.EP_API_VERSION`` and its compatibility rule checked when
a plugin library registers, the ``epctx.ep.PluginEpFactory`` base that IREE's factory and the fixture plugin
are written on, and provider option keys starting with ``epctx.`` reserved to the framework."""

from __future__ import annotations

import gc
import textwrap
from pathlib import Path

import numpy as np
import pytest

import epctx
import epctx.ep
from epctx.errors import IncompatibleEPApi, InvalidArgument
from epctx.providers import registry

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "plugin_ep"

LIBRARY = """
from epctx.ep import ExecutionProvider, PluginEpFactory


class TinyEP(ExecutionProvider):
    name = "TinyVersionedExecutionProvider"

    def get_capability(self, graph, opset_imports, ctx):
        from epctx.ep import Capability

        return Capability(())


class TinyFactory(PluginEpFactory):
    ep_name = TinyEP.name
    ep_vendor = "Tiny"
    ep_class = TinyEP
    {declaration}


create_ep_factories = TinyFactory.create_ep_factories
"""


def _library(tmp_path: Path, declaration: str) -> Path:
    path = tmp_path / "tiny_ep.py"
    path.write_text(textwrap.dedent(LIBRARY).replace("{declaration}", declaration))
    return path


def _unregister(name: str) -> None:
    gc.collect()
    if name in registry.registered_libraries():
        epctx.unregister_execution_provider_library(name)


def test_the_version_is_major_minor() -> None:
    major, dot, minor = epctx.ep.EP_API_VERSION.partition(".")
    assert dot and major.isdigit() and minor.isdigit()
    assert "EP_API_VERSION" in epctx.ep.__all__ and "PluginEpFactory" in epctx.ep.__all__


def _accepted() -> list[str]:
    major, minor = map(int, epctx.ep.EP_API_VERSION.split("."))
    return [f"{major}.{m}" for m in range(minor + 1)]


def _refused() -> list[tuple[str, str]]:
    major, minor = map(int, epctx.ep.EP_API_VERSION.split("."))
    return [
        (f"ep_api_version = '{major}.{minor + 1}'", "update epctx"),
        (f"ep_api_version = '{major + 1}.0'", "update epctx"),
        (f"ep_api_version = '{major - 1}.0'", "port the library"),
        ("ep_api_version = 'two'", "'major.minor' string"),
        ("ep_api_version = 2", "'major.minor' string"),
        ("", "declares no EP API version"),
    ]


@pytest.mark.parametrize("version", _accepted())
def test_a_library_of_this_api_registers_and_runs(tmp_path: Path, version: str) -> None:
    name = f"tiny_{version.replace('.', '_')}"
    epctx.register_execution_provider_library(name, str(_library(tmp_path, f"ep_api_version = {version!r}")))
    try:
        devices = [d for d in epctx.get_ep_devices() if d.ep_name == "TinyVersionedExecutionProvider"]
        assert devices and all(d.device.type == epctx.OrtHardwareDeviceType.CPU for d in devices)
        from onnx import TensorProto, helper

        graph = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        sess = epctx.InferenceSession(
            model.SerializeToString(), providers=["TinyVersionedExecutionProvider", "CPUExecutionProvider"]
        )
        assert sess.get_providers()[0] == "TinyVersionedExecutionProvider"
        out = sess.run(None, {"x": np.array([-1.0, 2.0], np.float32)})
        np.testing.assert_array_equal(out[0], [0.0, 2.0])
        del sess
    finally:
        _unregister(name)


@pytest.mark.parametrize(("declaration", "match"), _refused())
def test_a_library_of_another_api_is_refused_at_registration(
    tmp_path: Path, declaration: str, match: str
) -> None:
    with pytest.raises(IncompatibleEPApi, match=match) as caught:
        epctx.register_execution_provider_library("tiny_bad", str(_library(tmp_path, declaration)))
    assert isinstance(caught.value, InvalidArgument)  # the typed error is an InvalidArgument
    assert "tiny_bad" in str(caught.value) and "TinyVersionedExecutionProvider" in str(caught.value)
    assert "tiny_bad" not in registry.registered_libraries()
    assert not [d for d in epctx.get_ep_devices() if d.ep_name == "TinyVersionedExecutionProvider"]


def test_iree_and_the_fixture_plugin_are_written_on_the_base() -> None:
    import importlib.util
    import sys

    from epctx.providers.iree.library import IREEFactory

    spec = importlib.util.spec_from_file_location("_plugin_ep_probe", FIXTURES / "plugin_ep.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(spec.name, None)
    for factory_class in (IREEFactory, module.ContosoFactory):
        assert issubclass(factory_class, epctx.ep.PluginEpFactory)
        assert factory_class.ep_api_version == epctx.ep.EP_API_VERSION
    plain, virtual = module.create_ep_factories("c", {}), module.create_ep_factories("c.virtual", {
        "allow_virtual_devices": "1"})  # fmt: skip
    cpu = epctx.ep.cpu_device()
    assert [d.device.type for d in plain[0].get_supported_devices([cpu])] == [epctx.ep.HardwareDeviceType.CPU]
    assert len(virtual[0].get_supported_devices([cpu])) == 2  # the CPU and the virtual GPU


def test_create_ep_merges_device_options_under_the_sessions() -> None:
    class Recorder(epctx.ep.ExecutionProvider):
        name = "RecorderExecutionProvider"

        def get_capability(self, graph, opset_imports, ctx):  # type: ignore[no-untyped-def]
            return epctx.ep.Capability(())

    class Factory(epctx.ep.PluginEpFactory):
        ep_name, ep_vendor, ep_api_version, ep_class = Recorder.name, "R", epctx.ep.EP_API_VERSION, Recorder

    cpu = epctx.ep.cpu_device()
    a = epctx.ep.EpDevice(Recorder.name, "R", {}, {"target": "a", "level": "1"}, cpu)
    b = epctx.ep.EpDevice(Recorder.name, "R", {}, {"target": "b"}, cpu)
    ep = Factory().create_ep([a], {"level": 2})
    assert dict(ep.options) == {"target": "a", "level": "2"}
    with pytest.raises(InvalidArgument, match="one device per session: devices with target='a'"):
        Factory().create_ep([a, b], {})


def test_provider_options_starting_with_epctx_are_reserved() -> None:
    with pytest.raises(InvalidArgument, match="reserved to the framework"):
        epctx.ep.Option("epctx.threads", "int")
    assert epctx.ep.RESERVED_OPTION_PREFIX == "epctx."
    epctx.ep.Option("threads", "int")  # any other name is the EP's
