"""Weightless mode's validation (onnxruntime's table in docs/design/Weightless_Mode.md) and the source planner,
without compiling anything: unknown values, modes an EP does not cover, device metadata, and which weights can
be mapped from the source (an external tensor whose bytes a compile transformed cannot)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from epctx.ep import SourcePlanner, WeightlessMode, WeightlessSetting, open_sources
from epctx.ep._weightless import covers, parse_mode, setting_for, supported_modes
from epctx.errors import EPFail, InvalidArgument, InvalidGraph, NoSuchFile
from epctx.options import SessionConfig


@pytest.mark.parametrize("value", ["3", "-1", "all", "1.0", " 1"])
def test_unknown_mode_is_invalid_argument(value: str) -> None:
    so = epctx.SessionOptions()
    with pytest.raises(InvalidArgument, match="ep.enable_weightless_mode"):
        so.add_session_config_entry("ep.enable_weightless_mode", value)
    with pytest.raises(InvalidArgument, match="ep.enable_weightless_mode"):
        parse_mode(value)


@pytest.mark.parametrize(
    ("supported", "mode", "ok"),
    [
        ("none", 1, False),
        ("none", 2, False),
        ("external_only", 1, True),
        ("external_only", 2, False),
        ("all", 1, False),
        ("all", 2, True),
        ("all_or_external_only", 1, True),
        ("all_or_external_only", 2, True),
        ("something_later", 1, False),  # unrecognised values cover no mode
        ("none", 0, True),  # NONE: no weightless checks
    ],
)
def test_supported_modes_table(supported: str, mode: int, ok: bool) -> None:
    assert covers(supported, WeightlessMode(mode)) is ok


def test_metadata_falls_back_to_the_older_key() -> None:
    assert supported_modes({"weightless_supported_modes": "all_or_external_only"}) == "all_or_external_only"
    assert supported_modes({"weightless_support": "all"}) == "all"
    assert supported_modes({}) == "none"


def _tiny(folder: Path) -> Path:
    weight = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [weight],
    )
    path = folder / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_mode_the_ep_does_not_cover_fails_before_compiling(tmp_path: Path) -> None:
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.enable_weightless_mode", "1")
    with pytest.raises(EPFail, match="ExampleExecutionProvider does not support weightless mode 1"):
        epctx.InferenceSession(str(_tiny(tmp_path)), so, providers=["ExampleExecutionProvider"])


def test_cpu_only_session_ignores_the_mode(tmp_path: Path) -> None:
    """The CPU EP copies nothing into a binary: a mode set on a CPU session changes nothing (as onnxruntime)."""
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.enable_weightless_mode", "2")
    sess = epctx.InferenceSession(str(_tiny(tmp_path)), so, providers=["CPUExecutionProvider"])
    out = sess.run(None, {"x": np.ones((1, 4), np.float32)})[0]
    np.testing.assert_allclose(
        out, np.ones((1, 4), np.float32) @ np.arange(16, dtype=np.float32).reshape(4, 4)
    )


def test_setting_reads_the_session_paths(tmp_path: Path) -> None:
    config = SessionConfig(
        {
            "ep.enable_weightless_mode": "2",
            "ep.context_source_model_path": "/models/m.onnx",
            "session.model_external_initializers_file_folder_path": "/weights",
        }
    )
    setting = setting_for("X", True, "all", config, str(tmp_path / "m_ctx.onnx"))
    assert setting.mode == WeightlessMode.ALL
    assert (setting.source_model, setting.weights_folder) == ("/models/m.onnx", "/weights")
    assert setting.context_folder == str(tmp_path)
    assert setting_for("CPU", False, "none", config, None).mode == WeightlessMode.NONE


def _external_model(folder: Path) -> tuple[ir.Model, Path]:
    big = numpy_helper.from_array(np.arange(1024, dtype=np.float32).reshape(32, 32), "big")
    small = numpy_helper.from_array(np.full((4,), 7.5, np.float32), "small")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "big"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])],
        [big, small],
    )
    path = folder / "m.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path, save_as_external_data=True, location="m.onnx.data", size_threshold=1024)
    return ir.load(path), path


def test_planner_maps_external_and_internal_weights(tmp_path: Path) -> None:
    model, path = _external_model(tmp_path)
    tensors = {v.name: v.const_value for v in model.graph.initializers.values()}
    big, small = tensors["big"], tensors["small"]
    assert big is not None and small is not None

    one = SourcePlanner(WeightlessSetting(WeightlessMode.EXTERNAL_ONLY, model_path=str(path)), "test")
    ref = one.ref(big, big.numpy())
    assert ref is not None and ref.length == 4096
    assert one.ref(small, small.numpy()) is None  # EXTERNAL_ONLY: an initializer inside the .onnx stays
    # Bytes a compile transformed (e.g. filters pre-transposed for a layout) cannot be mapped: kept.
    assert one.ref(big, np.ascontiguousarray(big.numpy().T)) is None
    assert [f.location for f in one.files] == ["m.onnx.data"]
    one.close()

    every = SourcePlanner(WeightlessSetting(WeightlessMode.ALL, model_path=str(path)), "test")
    inside = every.ref(small, small.numpy())
    assert inside is not None
    files = every.files
    assert files[inside.file].model and files[inside.file].location == "m.onnx"
    every.close()
    maps = open_sources(files, WeightlessSetting(context_folder=str(tmp_path)), "test")
    found = np.frombuffer(maps[inside.file], np.float32, 4, inside.offset)
    np.testing.assert_array_equal(found, small.numpy())


def test_open_sources_refuses_a_changed_or_missing_file(tmp_path: Path) -> None:
    model, path = _external_model(tmp_path)
    big = model.graph.initializers["big"].const_value
    planner = SourcePlanner(WeightlessSetting(WeightlessMode.EXTERNAL_ONLY), "test")
    assert planner.ref(big, big.numpy()) is not None
    files = planner.files
    planner.close()
    data = tmp_path / "m.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 1
    data.write_bytes(raw)  # same size, one bit flipped
    with pytest.raises(InvalidGraph, match="m.onnx.data' changed since the context was compiled"):
        open_sources(files, WeightlessSetting(context_folder=str(tmp_path)), "test")
    raw[100] ^= 1
    data.write_bytes(raw)  # restored: loads again (a new file version is hashed again)
    assert len(open_sources(files, WeightlessSetting(context_folder=str(tmp_path)), "test")) == 1
    with pytest.raises(NoSuchFile, match="session.model_external_initializers_file_folder_path"):
        open_sources(files, WeightlessSetting(context_folder=str(tmp_path / "elsewhere")), "test")
    moved = tmp_path / "shared"
    moved.mkdir()
    data.rename(moved / "m.onnx.data")
    setting = WeightlessSetting(weights_folder=str(moved), context_folder=str(tmp_path))
    assert len(open_sources(files, setting, "test")) == 1
    assert path.exists()
