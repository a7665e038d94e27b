"""Load-time type and shape checking: the models onnxruntime refuses at load are refused at load (Fail, with
ONNX's message naming the node), never run; the ones it accepts (custom domains, lenient shape merges, the
real models of the wheels) load."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto

import epctx
from epctx.errors import Fail, NotImplemented
from epctx.model import load_model

ort = pytest.importorskip("onnxruntime")

X = oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])


def _model(nodes: list[onnx.NodeProto], inputs: list, outputs: list, inits=(), opsets=(("", 17),)) -> bytes:
    graph = oh.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid(d, v) for d, v in opsets])
    return model.SerializeToString()


def _ort_refuses(data: bytes) -> str:
    with pytest.raises(Exception) as info:
        ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return str(info.value)


def _conv64() -> bytes:
    weights = oh.make_tensor("w", TensorProto.DOUBLE, [2, 3, 3, 3], np.random.rand(54).astype(np.float64))
    conv = oh.make_node("Conv", ["x", "w"], ["y"], name="conv64")
    return _model([conv], [X], [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weights])


def _add_mismatch() -> bytes:
    a = oh.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3])
    b = oh.make_tensor_value_info("b", TensorProto.FLOAT, [4, 5])
    add = oh.make_node("Add", ["a", "b"], ["y"], name="bad_add")
    return _model([add], [a, b], [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)])


def _output_type_mismatch() -> bytes:
    relu = oh.make_node("Relu", ["x"], ["y"], name="relu_as_double")
    return _model([relu], [X], [oh.make_tensor_value_info("y", TensorProto.DOUBLE, [1, 3, 8, 8])])


def _in_if_body() -> bytes:
    """The Conv of ``_conv64`` inside an If branch: subgraphs are checked as well."""
    weights = oh.make_tensor("w", TensorProto.DOUBLE, [2, 3, 3, 3], np.random.rand(54).astype(np.float64))
    out = oh.make_tensor_value_info("y", TensorProto.FLOAT, None)
    then = oh.make_graph([oh.make_node("Conv", ["x", "w"], ["y"], name="conv64_in_if")], "then", [], [out])
    other = oh.make_graph([oh.make_node("Identity", ["x"], ["y"], name="id")], "else", [], [out])
    cond = oh.make_tensor_value_info("c", TensorProto.BOOL, [])
    node = oh.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)
    return _model([node], [cond, X], [out], [weights])


@pytest.mark.parametrize(
    ("make", "node", "what"),
    [
        (_conv64, "conv64", "W has inconsistent type tensor(double)"),
        (_add_mismatch, "bad_add", "Incompatible dimensions"),
        (_output_type_mismatch, "relu_as_double", "Inferred elem type differs"),
        (_in_if_body, "conv64_in_if", "inconsistent type"),
    ],
)
def test_refused_at_load_as_onnxruntime(make, node: str, what: str, tmp_path: Path) -> None:
    data = make()
    _ort_refuses(data)
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    with pytest.raises(Fail, match="failed type and shape inference") as info:
        epctx.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    message = str(info.value)
    assert node in message and what in message and "m.onnx" in message


def test_refused_on_every_provider_list() -> None:
    """The check is the loader's, not an EP's: a compiling EP in the list changes nothing."""
    with pytest.raises(Fail, match="W has inconsistent type"):
        epctx.InferenceSession(_conv64(), providers=["OpenVINOExecutionProvider", "CPUExecutionProvider"])


def test_declared_shape_conflict_is_lenient_as_onnxruntime(caplog: pytest.LogCaptureFixture) -> None:
    """onnxruntime warns ("Falling back to lenient merge") for a declared output shape that differs from the
    inferred one and runs the model: so does epctx."""
    relu = oh.make_node("Relu", ["x"], ["y"], name="relu")
    data = _model([relu], [X], [oh.make_tensor_value_info("y", TensorProto.FLOAT, [7, 3, 8, 8])])
    x = np.random.rand(1, 3, 8, 8).astype(np.float32)
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with caplog.at_level("WARNING", logger="epctx"):
        got = epctx.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, expected)
    assert "Inferred shape and existing shape differ" in caplog.text


def test_custom_domains_are_not_refused() -> None:
    """Operators ONNX has no schema for (a custom domain, com.microsoft) pass the check; the session then says
    that no EP implements them (NotImplemented), not that their types are wrong."""
    custom = oh.make_node("Gelu", ["x"], ["z"], domain="com.microsoft", name="ms_gelu")
    mine = oh.make_node("MyOp", ["z"], ["w"], domain="my.domain", name="my_op")
    relu = oh.make_node("Relu", ["w"], ["y"], name="relu")
    out = oh.make_tensor_value_info("y", TensorProto.FLOAT, None)
    opsets = (("", 17), ("com.microsoft", 1), ("my.domain", 1))
    data = _model([custom, mine, relu], [X], [out], opsets=opsets)
    load_model(data, infer_types=True)  # no Fail
    with pytest.raises(NotImplemented, match="MyOp"):
        epctx.InferenceSession(data, providers=["CPUExecutionProvider"])


def _wheel_model(package: str, *parts: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"the {package} wheel is not installed")
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)
    if not path.is_file():
        pytest.skip(f"{package} does not ship {'/'.join(parts)}")
    return path


@pytest.mark.parametrize(
    "where",
    [
        ("silero_vad", "data", "silero_vad.onnx"),  # If bodies, a scalar input
        ("silero_vad", "data", "silero_vad_half.onnx"),
        ("rapidocr_onnxruntime", "models", "ch_PP-OCRv4_rec_infer.onnx"),  # Paddle export
        ("magika", "models", "standard_v3_3", "model.onnx"),  # TensorFlow export
    ],
)
def test_real_models_pass_the_check(where: tuple[str, ...]) -> None:
    path = _wheel_model(*where)
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    start = time.perf_counter()
    load_model(path, infer_types=True)
    print(f"{path.name}: full load with the type check {1e3 * (time.perf_counter() - start):.1f} ms")


def test_function_op_inference_limits_are_not_refused() -> None:
    """ONNX's strict inference fails inside the function body it expands for MeanVarianceNormalization (a
    Constant with a referenced attribute); onnxruntime runs the op: so does epctx, with the same result."""
    node = oh.make_node("MeanVarianceNormalization", ["x"], ["y"], name="mvn")
    data = _model([node], [X], [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])])
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    (want,) = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (got,) = epctx.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
