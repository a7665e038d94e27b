"""run() variants: run([]), Python lists in feeds, run_with_ort_values, run_async, model metadata."""

import threading

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

graph = helper.make_graph(
    [
        helper.make_node("Mul", ["a", "b"], ["p"], name="mul"),
        helper.make_node("Cast", ["n"], ["nf"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Add", ["p", "nf"], ["q"], name="add"),
    ],
    "g",
    [
        helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 3]),
        helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 3]),
        helper.make_tensor_value_info("n", TensorProto.INT64, [1, 3]),
    ],
    [
        helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 3]),
        helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, 3]),
    ],
)
model = helper.make_model(
    graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="parity", doc_string="d"
)
model.model_version = 42
helper.set_model_props(model, {"author": "me"})
onnx.save(model, "model.onnx")
sess = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
feed = {
    "a": np.array([[1.5, 2, 3]], np.float32),
    "b": np.array([[2, 2, 2]], np.float32),
    "n": np.array([[1, 2, 3]]),
}

print("run([]):", [r.tolist() for r in sess.run([], feed)])
print("run(None):", [r.tolist() for r in sess.run(None, feed)])
print("run(['q']):", [r.tolist() for r in sess.run(["q"], feed)])
print(
    "lists:",
    [r.tolist() for r in sess.run(None, {"a": [[1, 2, 3]], "b": [[0.5, 0.25, True]], "n": [[1, 2, 3]]})],
)
print("int list to int64:", sess.run(["q"], {**feed, "n": [[7, 8, 9]]})[0].tolist())

meta = sess.get_modelmeta()
print("meta:", meta.version, meta.producer_name, meta.description, meta.graph_name, meta.custom_metadata_map)
print("inputs:", [(i.name, i.type, i.shape) for i in sess.get_inputs()])
print("outputs:", [(o.name, o.type, o.shape) for o in sess.get_outputs()])

values = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in feed.items()}
res = sess.run_with_ort_values(["q", "p"], values)
print("run_with_ort_values:", [type(r).__name__ for r in res], [r.numpy().tolist() for r in res])
print("ortvalue feed to run:", sess.run(["q"], values)[0].tolist())

done = threading.Event()
got = {}


def callback(outputs, user_data, err):
    got["out"] = [o.tolist() for o in outputs]
    got["user_data"] = user_data
    got["err"] = err
    done.set()


sess.run_async(["q"], feed, callback, {"id": 7})
done.wait(30)
print("run_async:", got["out"], got["user_data"], repr(got["err"]))

done.clear()
sess.run_async(["q"], {**feed, "a": feed["a"].astype(np.float64)}, callback, "bad")
done.wait(30)
print("run_async error:", got["out"], got["user_data"], bool(got["err"]))
