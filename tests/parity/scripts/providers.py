"""Provider lists as people write them."""

import contextlib
import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

graph = helper.make_graph(
    [
        helper.make_node("Add", ["x", "y"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["r"], name="relu"),
    ],
    "g",
    [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
    ],
    [helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 3])],
)
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "model.onnx")
x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
feed = {"x": x, "y": np.full((2, 3), 0.5, np.float32)}

print("available has CPU:", "CPUExecutionProvider" in ort.get_available_providers())
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    sess = ort.InferenceSession("model.onnx", providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
print("providers:", sess.get_providers())
print("warned:", any("CUDAExecutionProvider" in str(w.message) for w in caught))
print(
    "warning text:",
    any(
        str(w.message).startswith("Specified provider 'CUDAExecutionProvider' is not in available")
        for w in caught
    ),
)
print("result:", sess.run(None, feed)[0].round(4).tolist())

sess = ort.InferenceSession("model.onnx", providers=[("CPUExecutionProvider", {})])
print("tuple form:", sess.get_providers())
sess = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"], provider_options=[{}])
print("provider_options:", sess.get_providers())
sess = ort.InferenceSession("model.onnx")
print("default:", sess.get_providers()[-1])
sess.set_providers(["CPUExecutionProvider"])
print("set_providers:", sess.get_providers(), sess.run(None, feed)[0].round(4).tolist())
print("device:", ort.get_device())

with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
    warnings.simplefilter("ignore")
    try:
        ort.InferenceSession("model.onnx", providers=["NoSuchExecutionProvider", "CPUExecutionProvider"])
        outcome = "ran"
    except Exception as exc:
        outcome = type(exc).__name__
print("unknown provider:", outcome)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    so = ort.SessionOptions()
    so.add_session_config_entry("session.unavailable_ep_is_error", "1")
    try:
        ort.InferenceSession("model.onnx", so, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        print("unavailable as error: ran")
    except Exception as exc:
        print("unavailable as error:", type(exc).__name__)
