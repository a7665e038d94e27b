"""onnxruntime's ``com.microsoft::DynamicQuantizeLSTM`` on the CPU EP (``kernels/quant_rnn.py``), the op
``onnxruntime.quantization.quantize_dynamic`` makes of an LSTM (ddddocr's older captcha model holds one): the same
numbers as onnxruntime's kernel with one thread (each product's left operand quantized over all its rows; with
more threads onnxruntime quantizes each thread's batch rows apart, and its own result changes with its thread
count), not those of the float LSTM it was quantized from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx

pytest.importorskip("onnxruntime.quantization")


def _quantized_lstm(
    tmp_path: Path, direction: str, weight_type: str, seq: int, batch: int, states: bool
) -> tuple[bytes, bytes]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(3)
    nd, hidden, width = (2 if direction == "bidirectional" else 1), 24, 16
    inits = [
        numpy_helper.from_array(rng.standard_normal((nd, 4 * hidden, width)).astype(np.float32) * 0.4, "W"),
        numpy_helper.from_array(rng.standard_normal((nd, 4 * hidden, hidden)).astype(np.float32) * 0.4, "R"),
        numpy_helper.from_array(rng.standard_normal((nd, 8 * hidden)).astype(np.float32) * 0.1, "B"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, batch, width])]
    names = ["x", "W", "R", "B", ""]
    if states:
        names += ["h0", "c0"]
        inputs += [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, [nd, batch, hidden]) for n in ("h0", "c0")
        ]
    node = helper.make_node("LSTM", names, ["y", "yh", "yc"], hidden_size=hidden, direction=direction)
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [seq, nd, batch, hidden]),
        helper.make_tensor_value_info("yh", TensorProto.FLOAT, [nd, batch, hidden]),
        helper.make_tensor_value_info("yc", TensorProto.FLOAT, [nd, batch, hidden]),
    ]
    graph = helper.make_graph([node], "lstm", inputs, outputs, inits)
    source, target = tmp_path / "lstm.onnx", tmp_path / "lstm_quantized.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), str(source))
    quantize_dynamic(
        str(source), str(target), weight_type=getattr(QuantType, weight_type), op_types_to_quantize=["LSTM"]
    )
    return source.read_bytes(), target.read_bytes()


@pytest.mark.parametrize(
    ("direction", "weight_type", "seq", "batch", "states"),
    [
        ("forward", "QInt8", 5, 2, False),
        ("forward", "QUInt8", 3, 3, True),
        ("bidirectional", "QInt8", 4, 2, True),
        ("reverse", "QUInt8", 1, 1, False),
    ],
)
def test_dynamic_quantize_lstm_gives_onnxruntimes_numbers(
    tmp_path: Path, direction: str, weight_type: str, seq: int, batch: int, states: bool
) -> None:
    import onnxruntime as ort

    source, model = _quantized_lstm(tmp_path, direction, weight_type, seq, batch, states)
    assert [n.op_type for n in onnx.load_from_string(model).graph.node] == ["DynamicQuantizeLSTM"]
    rng = np.random.default_rng(4)
    nd = 2 if direction == "bidirectional" else 1
    feed = {"x": rng.standard_normal((seq, batch, 16)).astype(np.float32)}
    if states:
        feed |= {n: rng.standard_normal((nd, batch, 24)).astype(np.float32) * 0.5 for n in ("h0", "c0")}
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    expected = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feed)
    got = epctx.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feed)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape and g.dtype == np.float32
        np.testing.assert_allclose(g, e, rtol=0, atol=1e-5)
    float_lstm = ort.InferenceSession(source, so, providers=["CPUExecutionProvider"]).run(None, feed)
    if seq > 1:  # the quantized numbers, not the float LSTM's
        assert float(np.max(np.abs(float_lstm[0] - expected[0]))) > 1e-3
