"""Generation without copies of the weights: tensors own their data once, OpenVINO reads them in place, the
blob streams to a file and memory-mapped payloads are written chunk by chunk (benchmarks/bench_openvino_memory.py
measures the peaks)."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from epctx.ep._memory import release_pages
from epctx.epcontext.container import ContextBinary
from epctx.epcontext.writer import ContextBinaryWriter
from epctx.model import load_model


def _model(path: Path, *, external: bool) -> tuple[Path, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    weights = {f"W{k}": rng.standard_normal((64, 64)).astype(np.float32) for k in range(3)}
    nodes, x = [], "x"
    for k, name in enumerate(weights):
        y = "y" if k == len(weights) - 1 else f"h{k}"
        nodes.append(helper.make_node("MatMul", [x, name], [y]))
        x = y
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [numpy_helper.from_array(w, n) for n, w in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, path, save_as_external_data=external, size_threshold=0, location="w.data")
    return path, weights


def test_loaded_tensors_own_their_data_once(tmp_path: Path) -> None:
    path, weights = _model(tmp_path / "m.onnx", external=False)
    graph = load_model(path).model.graph
    for name, expected in weights.items():
        tensor = graph.initializers[name].const_value
        assert not isinstance(tensor, ir.serde.TensorProtoTensor)  # the parsed proto is not kept alive
        assert tensor.numpy() is tensor.numpy()  # one array, not a copy per call
        np.testing.assert_array_equal(tensor.numpy(), expected)


def test_external_tensors_stay_mapped(tmp_path: Path) -> None:
    path, weights = _model(tmp_path / "m.onnx", external=True)
    graph = load_model(path).model.graph
    for name, expected in weights.items():
        tensor = graph.initializers[name].const_value
        assert isinstance(tensor, ir.ExternalTensor)
        np.testing.assert_array_equal(tensor.numpy(), expected)


def test_streamed_blob_is_the_exported_blob() -> None:
    ov = pytest.importorskip("openvino")
    from openvino import opset13 as ops

    from epctx.providers.openvino.context import exported_blob

    x = ops.parameter([1, 64], np.float32, name="x")
    weight = ops.constant(np.random.default_rng(1).random((64, 64), dtype=np.float32))
    compiled = ov.Core().compile_model(ov.Model([ops.matmul(x, weight, False, False)], [x]), "CPU")
    assert bytes(exported_blob(compiled)) == bytes(compiled.export_model().getbuffer())


def test_compiled_partition_reads_weights_in_place(tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    import epctx

    path, weights = _model(tmp_path / "m.onnx", external=True)
    x = np.random.default_rng(2).standard_normal((1, 64)).astype(np.float32)
    session = epctx.InferenceSession(path, providers=["OpenVINOExecutionProvider"])
    expected = x
    for w in weights.values():
        expected = expected @ w
    np.testing.assert_allclose(session.run(None, {"x": x})[0], expected, rtol=1e-4, atol=1e-4)


def test_memory_mapped_payload_written_in_chunks(tmp_path: Path) -> None:
    data = np.random.default_rng(3).integers(0, 255, 20 << 20, dtype=np.uint8)
    source = tmp_path / "payload"
    source.write_bytes(data.tobytes())
    with open(source, "rb") as fh:
        view = memoryview(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))
    writer = ContextBinaryWriter(ep_name="X")
    writer.add("p", view)
    writer.add("a", np.frombuffer(view, np.uint8)[: 1 << 20])  # an array view of the same mapping
    writer.write(tmp_path / "b.bin")
    release_pages(view)
    binary = ContextBinary.open(tmp_path / "b.bin")
    assert bytes(binary.read("p")) == data.tobytes()
    assert bytes(binary.read("a")) == data[: 1 << 20].tobytes()
