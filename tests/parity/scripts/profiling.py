"""enable_profiling / end_profiling: a Chrome-trace JSON."""

import json
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

graph = helper.make_graph(
    [
        helper.make_node("Add", ["x", "x"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("Exp", ["r"], ["e"], name="exp"),
    ],
    "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
    [helper.make_tensor_value_info("e", TensorProto.FLOAT, [4])],
)
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "model.onnx")
so = ort.SessionOptions()
so.enable_profiling = True
so.profile_file_prefix = "parity_profile"
sess = ort.InferenceSession("model.onnx", so, providers=["CPUExecutionProvider"])
x = np.array([-1, 0, 0.5, 1], np.float32)
for _ in range(3):
    out = sess.run(None, {"x": x})[0]
print("result:", out.round(4).tolist())
print("start time set:", sess.get_profiling_start_time_ns() > 0)
path = sess.end_profiling()
print(
    "file:", os.path.basename(path).startswith("parity_profile"), path.endswith(".json"), os.path.exists(path)
)
with open(path) as f:
    events = json.load(f)
print("keys:", sorted({k for e in events for k in e}))
print("phases:", sorted({e["ph"] for e in events}))
print("categories:", sorted({e["cat"] for e in events}))
node_events = [e for e in events if e["cat"] == "Node"]
print("node events:", len(node_events))
print("node names:", sorted({e["name"] for e in node_events}))
print("ops:", sorted({e["args"]["op_name"] for e in node_events}))
print("providers:", sorted({e["args"]["provider"] for e in node_events}))
print("runs:", sum(e["name"] == "model_run" for e in events))
print(
    "session events:",
    "model_loading_uri" in {e["name"] for e in events},
    "session_initialization" in {e["name"] for e in events},
)
print("ints:", all(isinstance(e["ts"], int) and isinstance(e["dur"], int) and e["dur"] >= 0 for e in events))
sess.run(None, {"x": x})
print("second end:", repr(sess.end_profiling()))
