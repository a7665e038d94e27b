"""optimized_model_filepath, add_free_dimension_override_by_name / _by_denotation, add_initializer."""

import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
x_info.type.tensor_type.shape.dim[0].denotation = "DATA_BATCH"
graph = helper.make_graph(
    [
        helper.make_node("Mul", ["x", "w"], ["m"], name="mul"),
        helper.make_node("Add", ["m", "b"], ["y"], name="add"),
    ],
    "g",
    [x_info],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
    [
        helper.make_tensor("w", TensorProto.FLOAT, [3], [1, 2, 3]),
        helper.make_tensor("b", TensorProto.FLOAT, [3], [0.5, 0.5, 0.5]),
    ],
)
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "model.onnx")
x = np.ones((2, 3), np.float32)

so = ort.SessionOptions()
so.optimized_model_filepath = "optimized.onnx"
sess = ort.InferenceSession("model.onnx", so, providers=["CPUExecutionProvider"])
print("optimized written:", os.path.exists("optimized.onnx"))
onnx.checker.check_model(onnx.load("optimized.onnx"))
again = ort.InferenceSession("optimized.onnx", providers=["CPUExecutionProvider"])
print("optimized runs the same:", np.allclose(again.run(None, {"x": x})[0], sess.run(None, {"x": x})[0]))

so = ort.SessionOptions()
so.add_free_dimension_override_by_name("batch", 2)
sess = ort.InferenceSession("model.onnx", so, providers=["CPUExecutionProvider"])
print(
    "by name:", sess.get_inputs()[0].shape, sess.get_outputs()[0].shape, sess.run(None, {"x": x})[0].tolist()
)
try:
    sess.run(None, {"x": np.ones((5, 3), np.float32)})
    print("other batch: ran")
except Exception as exc:
    print("other batch:", type(exc).__name__)

so = ort.SessionOptions()
so.add_free_dimension_override_by_denotation("DATA_BATCH", 4)
sess = ort.InferenceSession("model.onnx", so, providers=["CPUExecutionProvider"])
print("by denotation:", sess.get_inputs()[0].shape)

w = ort.OrtValue.ortvalue_from_numpy(np.array([10, 20, 30], np.float32))
so = ort.SessionOptions()
so.add_initializer("w", w)
sess = ort.InferenceSession("model.onnx", so, providers=["CPUExecutionProvider"])
print("add_initializer:", sess.run(None, {"x": x})[0].tolist())
