"""Session config parsed once into a frozen typed value (issue 17): ``epctx.options.SessionConfig``.

onnxruntime 1.32 accepts any ``session.`` / ``ep.`` key it does not read (checked here against onnxruntime
itself), and so does epctx; an unknown key in epctx's own ``epctx.`` namespace is InvalidArgument, at
``add_session_config_entry`` and at session / ModelCompiler creation (options built around it)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import epctx
from epctx import options as opt
from epctx.errors import InvalidArgument


def _relu() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model.SerializeToString()


def test_defaults_are_typed() -> None:
    config = opt.SessionConfig()
    assert config.ep_context_enable is False and config.disable_model_compile is False
    assert config.ep_context_file_path == "" and config.trust_policy == "off"
    assert config.context_cache_max_mb is None and config.trust_keys == ()
    assert dict(config.entries) == {}


def test_entries_become_typed_fields() -> None:
    config = opt.SessionConfig(
        {
            "ep.context_enable": "1",
            "ep.context_file_path": "out/m_ctx.onnx",
            "session.disable_model_compile": "1",
            "epctx.context_cache_max_mb": "2.5",
            "epctx.trust.keys": os.pathsep.join(["a.pem", "", "b.pem"]),
            "epctx.trust.policy": "warn",
            "session.some_ort_key": "x",
        }
    )
    assert config.ep_context_enable is True and config.disable_model_compile is True
    assert config.ep_context_file_path == "out/m_ctx.onnx"
    assert config.context_cache_max_mb == 2.5
    assert config.trust_keys == ("a.pem", "b.pem") and config.trust_policy == "warn"
    assert config.entries["session.some_ort_key"] == "x"  # kept, not read


def test_weightless_refit_and_self_heal_fields() -> None:
    """Issue 18's keys, typed: the weightless mode an int (0 NONE when absent), the source path and the refit's
    context strings, the self-heal policy one of SELF_HEAL_POLICIES ("" is off, as the trust policy's)."""
    config = opt.SessionConfig()
    assert config.ep_enable_weightless_mode == 0 and config.self_heal == "off"
    assert config.ep_context_source_model_path == "" and config.refit_context == ""
    config = opt.SessionConfig(
        {
            "ep.enable_weightless_mode": "2",
            "ep.context_source_model_path": "/models/m.onnx",
            "epctx.refit_context": "old_ctx.onnx",
            "epctx.self_heal": "background",
        }
    )
    assert config.ep_enable_weightless_mode == 2 and config.self_heal == "background"
    assert config.ep_context_source_model_path == "/models/m.onnx" and config.refit_context == "old_ctx.onnx"
    assert opt.SessionConfig({"epctx.self_heal": ""}).self_heal == "off"


def test_frozen() -> None:
    config = opt.SessionConfig({"ep.context_enable": "1"})
    with pytest.raises(AttributeError, match="frozen"):
        config.ep_context_enable = False  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.entries["ep.context_enable"] = "0"  # type: ignore[index]
    changed = config.replace({"ep.context_enable": None, "epctx.context_cache": "c"})
    assert config.ep_context_enable is True and changed.ep_context_enable is False
    assert changed.context_cache == "c" and changed != config
    assert config == opt.SessionConfig({"ep.context_enable": "1"})


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("ep.context_enable", "2", "'0' or '1'"),
        ("session.disable_model_compile", "yes", "'0' or '1'"),
        ("epctx.context_cache_max_mb", "lots", "number of MB"),
        ("epctx.context_cache_max_mb", "-1", "number of MB"),
        ("epctx.trust.policy", "strict", "one of off, warn"),
        ("epctx.context_cach", "/tmp/c", "did you mean 'epctx.context_cache'"),
        ("epctx.no_such_thing", "1", "epctx's own"),
        ("ep.enable_weightless_mode", "3", r"'0' \(NONE\), '1' \(EXTERNAL_ONLY\) or '2' \(ALL\)"),
        ("ep.enable_weightless_mode", "", r"'0' \(NONE\)"),
        ("epctx.self_heal", "sometimes", "one of off, foreground, background"),
        ("epctx.refit_contex", "m_ctx.onnx", "did you mean 'epctx.refit_context'"),
    ],
)
def test_bad_entries_refused_when_added_and_when_parsed(key: str, value: str, match: str) -> None:
    so = epctx.SessionOptions()
    with pytest.raises(InvalidArgument, match=match):
        so.add_session_config_entry(key, value)
    with pytest.raises(InvalidArgument, match=match):
        opt.SessionConfig({key: value})


def test_unknown_epctx_key_refused_at_session_and_compiler_creation(tmp_path: Path) -> None:
    """Options whose entries bypass add_session_config_entry (derived by with_config) are parsed at creation."""
    so = opt.with_config(epctx.SessionOptions(), {"epctx.context_chache": str(tmp_path)})
    with pytest.raises(InvalidArgument, match="did you mean 'epctx.context_cache'"):
        epctx.InferenceSession(_relu(), so, providers=["CPUExecutionProvider"])
    with pytest.raises(InvalidArgument, match="epctx.context_chache"):
        epctx.ModelCompiler(so, _relu())


@pytest.mark.parametrize("key", ["session.bogus_key", "ep.bogus_key", "someone.else"])
def test_unknown_ort_namespace_keys_accepted_as_onnxruntime_does(key: str) -> None:
    x = np.array([-1.0, 2.0], np.float32)
    ort_so = ort.SessionOptions()
    ort_so.add_session_config_entry(key, "1")
    expected = ort.InferenceSession(_relu(), ort_so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    so = epctx.SessionOptions()
    so.add_session_config_entry(key, "1")
    got = epctx.InferenceSession(_relu(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(got[0], expected[0])


def test_compiler_reads_the_config_of_its_creation(tmp_path: Path) -> None:
    """ModelCompiler parses the options once, when created: a later change to them does not reach it."""
    source = tmp_path / "m.onnx"
    source.write_bytes(_relu())
    so = epctx.SessionOptions()
    so.add_provider("ExampleExecutionProvider")
    compiler = epctx.ModelCompiler(so, str(source))
    so.add_session_config_entry("ep.context_node_name_prefix", "later_")
    compiler.compile_to_file()
    nodes = onnx.load(str(tmp_path / "m_ctx.onnx")).graph.node
    assert [n.op_type for n in nodes] == ["EPContext"] and not nodes[0].name.startswith("later_")
    epctx.ModelCompiler(so, str(source)).compile_to_file(str(tmp_path / "p_ctx.onnx"))
    assert onnx.load(str(tmp_path / "p_ctx.onnx")).graph.node[0].name.startswith("later_")
