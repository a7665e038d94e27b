"""The onnxruntime-style API: InferenceSession, SessionOptions, NodeArg, providers, feeds and errors."""

from __future__ import annotations

import mmap
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from tests.oracle import assert_matches_ort


def _mlp(opset: int = 17) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("Add", ["h", "b"], ["a"], name="add"),
            helper.make_node("Relu", ["a"], ["y"], name="relu"),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tests")
    model.doc_string = "a tiny mlp"
    helper.set_model_props(model, {"author": "epctx"})
    return model


def test_run_matches_onnxruntime_from_path_and_bytes(tmp_path):
    model = _mlp()
    path = tmp_path / "mlp.onnx"
    onnx.save(model, path)
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    expected = assert_matches_ort(model, {"x": x})
    from_path = epctx.InferenceSession(str(path)).run(None, {"x": x})
    np.testing.assert_array_equal(from_path[0], expected[0])
    from_pathlike = epctx.InferenceSession(path, providers=["CPUExecutionProvider"]).run(["y"], {"x": x})
    np.testing.assert_array_equal(from_pathlike[0], expected[0])


def test_introspection():
    sess = epctx.InferenceSession(_mlp().SerializeToString())
    (inp,) = sess.get_inputs()
    assert (inp.name, inp.type, inp.shape) == ("x", "tensor(float)", ["batch", 4])
    (out,) = sess.get_outputs()
    assert (out.name, out.type, out.shape) == ("y", "tensor(float)", ["batch", 3])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert sess.get_provider_options() == {"CPUExecutionProvider": {}}
    meta = sess.get_modelmeta()
    assert meta.producer_name == "tests"
    assert meta.graph_name == "mlp"
    assert meta.description == "a tiny mlp"
    assert meta.custom_metadata_map == {"author": "epctx"}
    assert isinstance(sess.get_session_options(), epctx.SessionOptions)
    assert epctx.get_available_providers()[-1] == "CPUExecutionProvider"


def test_session_options_config_entries():
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    assert so.get_session_config_entry("ep.context_enable") == "1"
    with pytest.raises(epctx.InvalidArgument, match="ep.context_enable"):
        so.add_session_config_entry("ep.context_enable", "yes")
    with pytest.raises(epctx.InvalidArgument, match="not set"):
        so.get_session_config_entry("ep.context_file_path")
    so.graph_optimization_level = epctx.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    x = np.ones((1, 4), np.float32)
    out = epctx.InferenceSession(_mlp().SerializeToString(), so).run(None, {"x": x}, epctx.RunOptions())
    assert out[0].shape == (1, 3)


def test_provider_specs_and_errors():
    data = _mlp().SerializeToString()
    sess = epctx.InferenceSession(data, providers=[("CPUExecutionProvider", {})])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    with pytest.raises(epctx.InvalidArgument, match="NoSuchExecutionProvider"):
        epctx.InferenceSession(data, providers=["NoSuchExecutionProvider"])
    with pytest.raises(epctx.InvalidArgument, match="provider_options"):
        epctx.InferenceSession(data, providers=["CPUExecutionProvider"], provider_options=[{}, {}])
    with pytest.raises(epctx.InvalidArgument, match="providers\\[0\\]"):
        epctx.InferenceSession(data, providers=[42])


@pytest.mark.parametrize(
    ("feed", "match"),
    [
        ({"x": np.ones((2, 4), np.float64)}, r"'x' has dtype float64, expected float32"),
        ({"x": np.ones((4,), np.float32)}, r"'x' has rank 1 .* expected rank 2"),
        ({"x": np.ones((2, 5), np.float32)}, r"'x' has shape \[2, 5\], expected dimension 1 to be 4"),
        ({"x": np.ones((2, 4), np.float32), "z": np.ones(1)}, r"invalid input name\(s\) \['z'\]"),
        ({}, r"missing input 'x'"),
        ({"x": "text"}, r"'x' must be a numpy array"),
    ],
)
def test_bad_feeds_are_invalid_argument(feed, match):
    sess = epctx.InferenceSession(_mlp().SerializeToString())
    with pytest.raises(epctx.InvalidArgument, match=match):
        sess.run(None, feed)


def test_bad_output_name():
    sess = epctx.InferenceSession(_mlp().SerializeToString())
    with pytest.raises(epctx.InvalidArgument, match="invalid output name 'nope'"):
        sess.run(["nope"], {"x": np.ones((1, 4), np.float32)})


def test_missing_file_is_no_such_file(tmp_path):
    missing = tmp_path / "absent.onnx"
    with pytest.raises(epctx.NoSuchFile, match="absent.onnx"):
        epctx.InferenceSession(str(missing))
    with pytest.raises(epctx.InvalidArgument, match="is a folder"):
        epctx.InferenceSession(str(tmp_path))


def test_malformed_and_invalid_models_are_invalid_graph(tmp_path):
    with pytest.raises(epctx.InvalidGraph, match="not a valid ONNX protobuf"):
        epctx.InferenceSession(b"\x08\x07garbage\xff\xff\xff")
    bad = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["undefined_value"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        )
    )
    with pytest.raises(epctx.InvalidGraph, match="undefined_value"):
        epctx.InferenceSession(bad.SerializeToString())
    with pytest.raises(epctx.InvalidArgument, match="empty"):
        epctx.InferenceSession(b"")


def test_unsupported_op_names_op_domain_and_opset():
    graph = helper.make_graph(
        [helper.make_node("Frobnicate", ["x"], ["y"], domain="my.domain", name="frob")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("my.domain", 3)]
    )
    with pytest.raises(
        epctx.NotImplemented, match=r"Frobnicate \(domain 'my.domain', opset 3, node 'frob'\)"
    ):
        epctx.InferenceSession(model.SerializeToString())


def test_external_data_from_path_and_bytes(tmp_path):
    model = _mlp()
    path = tmp_path / "ext.onnx"
    onnx.save(
        _mlp(),
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="ext.data",
        size_threshold=0,
    )
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    expected = epctx.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(epctx.InferenceSession(str(path)).run(None, {"x": x})[0], expected)

    data = path.read_bytes()
    with pytest.raises(epctx.InvalidArgument, match="session.model_external_initializers_file_folder_path"):
        epctx.InferenceSession(data)
    so = epctx.SessionOptions()
    so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(tmp_path))
    np.testing.assert_array_equal(epctx.InferenceSession(data, so).run(None, {"x": x})[0], expected)

    (tmp_path / "ext.data").unlink()
    with pytest.raises(epctx.NoSuchFile, match="ext.data"):
        epctx.InferenceSession(str(path))


def test_external_data_is_memory_mapped_not_copied(tmp_path):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((256, 256)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 256])],
        [numpy_helper.from_array(w, "w")],
    )
    path = tmp_path / "big.onnx"
    onnx.save(
        helper.make_model(graph), path, save_as_external_data=True, location="big.data", size_threshold=0
    )
    so = epctx.SessionOptions()
    so.graph_optimization_level = epctx.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = epctx.InferenceSession(str(path), so)
    (y,) = sess.run(None, {})
    np.testing.assert_array_equal(y, w)
    y[0, 0] = 42.0  # outputs belong to the caller; the session's weights are untouched
    np.testing.assert_array_equal(sess.run(None, {})[0], w)
    # The weight the plan holds is a view of the file mapping: follow its buffer chain down to the mmap.
    (weight,) = [v for v in sess._plan.template if isinstance(v, np.ndarray)]
    base = weight
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    assert isinstance(base, mmap.mmap), f"weights were copied (buffer {type(base).__name__})"


def test_external_data_path_outside_folder_is_rejected(tmp_path):
    model = _mlp()
    sub = tmp_path / "m"
    sub.mkdir()
    onnx.save(model, sub / "m.onnx", save_as_external_data=True, location="w.data", size_threshold=0)
    m = onnx.load(sub / "m.onnx", load_external_data=False)
    for init in m.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = "../w.data"
    (tmp_path / "w.data").write_bytes((sub / "w.data").read_bytes())
    data = m.SerializeToString()
    (sub / "evil.onnx").write_bytes(data)
    with pytest.raises((epctx.InvalidGraph, epctx.NoSuchFile)):
        epctx.InferenceSession(str(sub / "evil.onnx"))


def test_overridable_initializer_and_defaults():
    # IR 3 style: an initializer also listed as a graph input may be fed to override it.
    w = numpy_helper.from_array(np.full((2,), 2.0, np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["y"])],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [w],
    )
    model = helper.make_model(graph, ir_version=7, opset_imports=[helper.make_opsetid("", 13)])
    sess = epctx.InferenceSession(model.SerializeToString())
    assert [i.name for i in sess.get_inputs()] == ["x"]
    assert [i.name for i in sess.get_overridable_initializers()] == ["w"]
    x = np.ones(2, np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], [2, 2])
    np.testing.assert_array_equal(sess.run(None, {"x": x, "w": np.full(2, 3, np.float32)})[0], [3, 3])


def test_control_flow_reads_outer_scope():
    then = helper.make_graph(
        [helper.make_node("Add", ["x", "y"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", 1, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Sub", ["x", "y"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", 1, None)],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["a"], ["x"]),
            helper.make_node("If", ["c"], ["z"], then_branch=then, else_branch=other),
        ],
        "g",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [3]),
        ],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    a = np.array([-1, 2, 3], np.float32)
    y = np.array([1, 1, 1], np.float32)
    for c in (True, False):
        assert_matches_ort(model, {"c": np.array(c), "a": a, "y": y})


def test_import_is_light():
    code = (
        "import sys, time; t = time.perf_counter(); import epctx; dt = time.perf_counter() - t;"
        "bad = [m for m in ('openvino', 'iree', 'onnxruntime', 'scipy', 'onnx_ir', 'sympy') if m in sys.modules];"
        "print(dt, bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[1] == "[]", f"import epctx imported a backend: {out}"


def test_negative_dim_value_is_dynamic():
    # paddle2onnx exports write the batch dimension as dim_value -1; onnxruntime treats it as dynamic.
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = epctx.InferenceSession(model.SerializeToString())
    assert sess.get_inputs()[0].shape == [None, 3]
    assert sess.run(None, {"x": np.ones((5, 3), np.float32)})[0].shape == (5, 3)


def test_string_initializers_compare_with_str_feeds():
    graph = helper.make_graph(
        [helper.make_node("Equal", ["s", "c"], ["y"])],
        "g",
        [helper.make_tensor_value_info("s", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("y", TensorProto.BOOL, [2])],
        [helper.make_tensor("c", TensorProto.STRING, [2], [b"a", b"b"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    assert_matches_ort(model, {"s": np.array(["a", "x"], dtype=object)})


def test_numpy_floating_point_warnings_are_silent():
    graph = helper.make_graph(
        [helper.make_node("Log", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    sess = epctx.InferenceSession(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    )
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (y,) = sess.run(None, {"x": np.array([0.0, -1.0], np.float32)})
    assert np.isneginf(y[0]) and np.isnan(y[1])


def test_graph_outputs_of_unknown_rank_are_accepted():
    # onnxruntime accepts value infos without a shape (unknown rank); so does epctx.
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = epctx.InferenceSession(model.SerializeToString())
    assert sess.get_inputs()[0].shape is None
    assert_matches_ort(model, {"x": np.array([[-1.0, 2.0]], np.float32)})


def test_get_all_providers_has_onnxruntimes_meaning():
    ort = pytest.importorskip("onnxruntime")
    from epctx.providers.builtin import builtin_declarations

    every = epctx.get_all_providers()
    assert every[-1] == "CPUExecutionProvider" and len(set(every)) == len(every)
    # Usable or not: every built-in EP (its backend package installed or missing) and every available EP.
    assert {d.name for d in builtin_declarations()} <= set(every)
    assert set(epctx.get_available_providers()) <= set(every)
    # The names both runtimes know come in onnxruntime's order, and onnxruntime knows them as real providers.
    theirs = ort.get_all_providers()
    common = [n for n in every if n in theirs]
    assert {"CPUExecutionProvider", "OpenVINOExecutionProvider"} <= set(common)
    assert common == [n for n in theirs if n in common]
    # epctx's own EPs (Example, IREE) are epctx's names only.
    assert "IREEExecutionProvider" in every and "IREEExecutionProvider" not in theirs
