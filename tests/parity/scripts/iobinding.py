"""IOBinding and run_with_iobinding."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

graph = helper.make_graph(
    [
        helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
        helper.make_node("Tanh", ["y"], ["t"], name="tanh"),
    ],
    "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
    [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
        helper.make_tensor_value_info("t", TensorProto.FLOAT, ["batch", 3]),
    ],
    [helper.make_tensor("w", TensorProto.FLOAT, [4, 3], np.linspace(-1, 1, 12).tolist())],
)
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "model.onnx")
sess = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)

binding = sess.io_binding()
binding.bind_cpu_input("x", x)
binding.bind_output("y")
binding.bind_output("t")
sess.run_with_iobinding(binding)
outs = binding.copy_outputs_to_cpu()
print("by name:", [o.round(4).tolist() for o in outs])
print(
    "ortvalues:",
    [type(o).__name__ for o in binding.get_outputs()],
    [o.shape() for o in binding.get_outputs()],
)

# Pre-allocated outputs are written in place.
y = np.zeros((2, 3), np.float32)
t_value = ort.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32, "cpu", 0)
binding = sess.io_binding()
binding.bind_input("x", "cpu", 0, np.float32, list(x.shape), x.ctypes.data)
binding.bind_output("y", "cpu", 0, np.float32, list(y.shape), y.ctypes.data)
binding.bind_ortvalue_output("t", t_value)
sess.run_with_iobinding(binding)
print("in place y:", y.round(4).tolist())
print("in place t:", t_value.numpy().round(4).tolist())
print("same object:", binding.get_outputs()[1].numpy().ctypes.data == t_value.numpy().ctypes.data)

# Rebinding a new input and running again reuses the output buffers.
x2 = x * 2
binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x2))
sess.run_with_iobinding(binding)
print("second run y:", y.round(4).tolist())
binding.clear_binding_inputs()
binding.clear_binding_outputs()
binding.bind_cpu_input("x", x[:1].copy())
binding.bind_output("t")
sess.run_with_iobinding(binding)
print("after clear:", binding.copy_outputs_to_cpu()[0].round(4).tolist())

direct = ort.IOBinding(sess)
direct.bind_cpu_input("x", x)
direct.bind_output("y")
sess.run_with_iobinding(direct)
print("IOBinding(session):", direct.copy_outputs_to_cpu()[0].round(4).tolist())
