"""RunOptions.terminate and the exception classes users catch."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, NoSuchFile

graph = helper.make_graph(
    [helper.make_node("Neg", ["x"], ["y"], name="neg")],
    "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
)
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "model.onnx")
sess = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
x = np.array([1, -2], np.float32)

ro = ort.RunOptions()
ro.terminate = True
try:
    sess.run(None, {"x": x}, ro)
    print("terminate: ran")
except Fail as exc:
    print("terminate: Fail", "terminate flag" in str(exc))
ro.terminate = False
print("after reset:", sess.run(None, {"x": x}, ro)[0].tolist())

try:
    sess.run(None, {"x": x.astype(np.float64)})
except InvalidArgument as exc:
    print("wrong dtype: InvalidArgument", "Unexpected input data type" in str(exc))
try:
    sess.run(None, {"x": np.ones(3, np.float32)})
except InvalidArgument as exc:
    print("wrong shape: InvalidArgument", "Got invalid dimensions for input" in str(exc))
try:
    sess.run(None, {"nope": x})
except Exception as exc:
    print("unknown input:", isinstance(exc, ValueError))
try:
    ort.InferenceSession("missing.onnx", providers=["CPUExecutionProvider"])
except NoSuchFile:
    print("missing file: NoSuchFile")
import onnxruntime.capi.onnxruntime_pybind11_state as state  # noqa: E402

names = [
    "Fail",
    "InvalidArgument",
    "NoSuchFile",
    "NoModel",
    "EngineError",
    "RuntimeException",
    "InvalidProtobuf",
    "ModelLoaded",
    "NotImplemented",
    "InvalidGraph",
    "EPFail",
    "ModelRequiresCompilation",
    "NotFound",
]
print("classes:", all(issubclass(getattr(state, n), Exception) for n in names))
print("compile flags:", hasattr(ort, "OrtCompileApiFlags"), hasattr(ort, "ModelCompiler"))
