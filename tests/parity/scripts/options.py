"""SessionOptions / RunOptions: attributes, typos, threads, execution mode, logging."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

graph = helper.make_graph(
    [
        helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
        helper.make_node("Sigmoid", ["y"], ["z"], name="sig"),
    ],
    "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
    [helper.make_tensor_value_info("z", TensorProto.FLOAT, [64, 64])],
    [helper.make_tensor("w", TensorProto.FLOAT, [64, 64], (np.arange(4096) % 7 / 7 - 0.5).tolist())],
)
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "model.onnx")
x = (np.arange(4096, dtype=np.float32).reshape(64, 64) % 5) / 5
so = ort.SessionOptions()
print(
    "defaults:",
    so.intra_op_num_threads,
    so.inter_op_num_threads,
    so.log_severity_level,
    so.log_verbosity_level,
)
print(
    "modes:",
    so.execution_mode,
    so.graph_optimization_level,
    so.enable_profiling,
    so.optimized_model_filepath == "",
)
for name in ("intra_op_numthreads", "enable_profile", "graph_optimisation_level"):
    try:
        setattr(so, name, 1)
        print(f"typo {name}:", "accepted")
    except AttributeError:
        print(f"typo {name}:", "AttributeError")
try:
    ort.RunOptions().terminated = True
    print("run options typo:", "accepted")
except AttributeError:
    print("run options typo:", "AttributeError")

reference = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
so.intra_op_num_threads = 1
so.inter_op_num_threads = 1
so.log_severity_level = 3
so.log_verbosity_level = 0
so.logid = "parity"
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
sess = ort.InferenceSession("model.onnx", so, providers=["CPUExecutionProvider"])
print("one thread same result:", np.allclose(sess.run(None, {"x": x})[0], reference, atol=1e-5))
print(
    "session options kept:", sess.get_session_options().intra_op_num_threads, sess.get_session_options().logid
)

so2 = ort.SessionOptions()
so2.intra_op_num_threads = 2
so2.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
so2.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
sess = ort.InferenceSession("model.onnx", so2, providers=["CPUExecutionProvider"])
print("two threads same result:", np.allclose(sess.run(None, {"x": x})[0], reference, atol=1e-5))

ort.set_default_logger_severity(3)
ort.set_default_logger_verbosity(0)
ro = ort.RunOptions()
print("run options defaults:", ro.log_severity_level, ro.log_verbosity_level, repr(ro.logid), ro.terminate)
ro.log_severity_level = 3
ro.logid = "run-1"
print("with run options:", np.allclose(sess.run(None, {"x": x}, ro)[0], reference, atol=1e-5))
ro.add_run_config_entry("some.key", "1")
print("run config:", ro.get_run_config_entry("some.key"))
so3 = ort.SessionOptions()
so3.add_session_config_entry("session.disable_cpu_ep_fallback", "0")
print("config entry:", so3.get_session_config_entry("session.disable_cpu_ep_fallback"))
try:
    so3.register_custom_ops_library("libcustom_ops_that_does_not_exist.so")
    print("custom ops: loaded")
except Exception as exc:
    print("custom ops:", type(exc).__name__)
