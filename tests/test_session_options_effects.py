"""SessionOptions / RunOptions that do what they say, and the drop-in details the parity scripts cannot
show (they compare epctx with onnxruntime; these check epctx's own side)."""

from __future__ import annotations

import logging
import threading
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import epctx
from epctx.ep import Capability, ExecutionProvider
from epctx.errors import EPCtxError
from tests.fusing_ep import registered


def _model(tmp_path, op="Identity"):
    graph = helper.make_graph(
        [
            helper.make_node(op, ["x"], ["y"], name="n0"),
            helper.make_node("MatMul", ["y", "y"], ["z"], name="mm"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [8, 8])],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def _blas_threads() -> list[int]:
    """numpy's BLAS thread counts (the CPU EP's kernels call no other BLAS; another library a test loaded, as
    torch's, is left as it is: the one-thread run scope sets numpy's OpenBLAS only)."""
    from threadpoolctl import threadpool_info

    infos = [i for i in threadpool_info() if i["user_api"] == "blas"]
    numpy_own = [i for i in infos if "numpy" in str(i.get("filepath", ""))]
    return [i["num_threads"] for i in (numpy_own or infos)]


class _ProbeEP(ExecutionProvider):
    """Runs Identity and records numpy's BLAS thread counts while it runs."""

    name = "ProbeExecutionProvider"
    seen: list[list[int]] = []

    def get_capability(self, graph, opset_imports, ctx):
        return Capability(tuple(n for n in graph if n.op_type == "Identity"))

    def create_kernel(self, ctx):
        def kernel(x):
            _ProbeEP.seen.append(_blas_threads())
            return [x]

        return kernel


def test_intra_op_num_threads_limits_blas_during_runs_only(tmp_path):
    pytest.importorskip("threadpoolctl")
    from threadpoolctl import threadpool_limits

    x = np.eye(8, dtype=np.float32)
    with registered(_ProbeEP), threadpool_limits(limits=2, user_api="blas"):
        if not _blas_threads():
            pytest.skip("numpy's BLAS is not visible to threadpoolctl")
        so = epctx.SessionOptions()
        so.intra_op_num_threads = 1
        sess = epctx.InferenceSession(_model(tmp_path), so, providers=[_ProbeEP.name, "CPUExecutionProvider"])
        assert sess.get_provider_options()["CPUExecutionProvider"] == {"intra_op_num_threads": "1"}
        _ProbeEP.seen.clear()
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x)
        assert _ProbeEP.seen and set(_ProbeEP.seen[0]) == {1}
        assert set(_blas_threads()) == {2}  # restored after the run
        plain = epctx.InferenceSession(_model(tmp_path), providers=[_ProbeEP.name, "CPUExecutionProvider"])
        _ProbeEP.seen.clear()
        plain.run(None, {"x": x})
        assert set(_ProbeEP.seen[0]) == {2}


def test_explicit_provider_option_wins_over_intra_op_num_threads(tmp_path):
    so = epctx.SessionOptions()
    so.intra_op_num_threads = 3
    sess = epctx.InferenceSession(
        _model(tmp_path), so, providers=[("CPUExecutionProvider", {"intra_op_num_threads": "1"})]
    )
    assert sess.get_provider_options()["CPUExecutionProvider"]["intra_op_num_threads"] == "1"
    with pytest.raises(epctx.InvalidArgument, match="intra_op_num_threads"):
        epctx.InferenceSession(
            _model(tmp_path), providers=[("CPUExecutionProvider", {"intra_op_num_threads": "x"})]
        )


def test_intra_op_num_threads_reaches_openvino(tmp_path):
    pytest.importorskip("openvino")
    so = epctx.SessionOptions()
    so.intra_op_num_threads = 2
    sess = epctx.InferenceSession(_model(tmp_path, "Relu"), so, providers=["OpenVINOExecutionProvider"])
    assert sess.get_provider_options()["OpenVINOExecutionProvider"]["num_of_threads"] == "2"


def test_unavailable_onnxruntime_ep_warns_through_logging_and_warnings(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="epctx"), pytest.warns(UserWarning, match="CUDAExecution"):
        sess = epctx.InferenceSession(
            _model(tmp_path), providers=["CUDAExecutionProvider", "CPUExecutionProvider"]
        )
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert "CUDAExecutionProvider" in caplog.text
    so = epctx.SessionOptions()
    so.add_session_config_entry("session.unavailable_ep_is_error", "1")
    with pytest.raises(epctx.InvalidArgument, match="session.unavailable_ep_is_error"):
        epctx.InferenceSession(_model(tmp_path), so, providers=["CUDAExecutionProvider"])
    with pytest.raises(epctx.InvalidArgument, match="unknown execution provider"):
        epctx.InferenceSession(_model(tmp_path), providers=["CudaExecutionProvidr"])


def test_parallel_mode_warns_and_runs_sequentially(tmp_path):
    so = epctx.SessionOptions()
    so.execution_mode = epctx.ExecutionMode.ORT_PARALLEL
    so.inter_op_num_threads = 4
    with pytest.warns(UserWarning, match="sequentially"):
        sess = epctx.InferenceSession(_model(tmp_path), so)
    x = np.eye(8, dtype=np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x)


def test_log_severity_maps_onto_the_epctx_logger(tmp_path, caplog):
    logger = logging.getLogger("epctx")
    before = logger.level
    try:
        epctx.set_default_logger_severity(3)
        assert logger.level == logging.ERROR
        with caplog.at_level(logging.DEBUG, logger="epctx"):
            so = epctx.SessionOptions()
            so.log_severity_level = 0
            epctx.InferenceSession(_model(tmp_path), so)
            assert "session ready" in caplog.text  # verbose while this session was created
            assert logger.level == logging.DEBUG  # caplog's; then ours again
        assert logger.level == logging.ERROR
        with pytest.raises(epctx.InvalidArgument, match="log severity"):
            epctx.set_default_logger_severity(7)
    finally:
        logger.setLevel(before)


def test_attribute_typos_raise_and_types_are_checked():
    so, ro = epctx.SessionOptions(), epctx.RunOptions()
    with pytest.raises(AttributeError):
        so.intra_op_numthreads = 2
    with pytest.raises(AttributeError):
        ro.terminated = True
    with pytest.raises(TypeError, match="intra_op_num_threads must be int"):
        so.intra_op_num_threads = "2"
    with pytest.raises(epctx.InvalidArgument, match="execution_mode"):
        so.execution_mode = 5
    ro.run_tag = "tag"
    assert ro.logid == "tag"
    with pytest.raises(epctx.NotImplemented, match="execution provider"):
        so.register_custom_ops_library("libx.so")


def test_terminate_set_during_a_run_stops_it_between_steps(tmp_path):
    ro = epctx.RunOptions()

    class _Stopper(_ProbeEP):
        name = "StopperExecutionProvider"

        def create_kernel(self, ctx):
            def kernel(x):
                ro.terminate = True  # as another thread would, while the run is in flight
                return [x]

            return kernel

    with registered(_Stopper):
        sess = epctx.InferenceSession(_model(tmp_path), providers=[_Stopper.name, "CPUExecutionProvider"])
        with pytest.raises(epctx.Fail, match="terminate flag"):
            sess.run(None, {"x": np.eye(8, dtype=np.float32)}, ro)


def test_iobinding_checks_devices_and_buffer_shapes(tmp_path):
    sess = epctx.InferenceSession(_model(tmp_path))
    binding = sess.io_binding()
    with pytest.raises(epctx.NotImplemented, match="host memory"):
        binding.bind_output("z", "cuda", 0)
    with pytest.raises(epctx.InvalidArgument, match="no input 'nope'"):
        binding.bind_cpu_input("nope", np.zeros(1))
    small = np.zeros((2, 2), np.float32)
    binding.bind_cpu_input("x", np.eye(8, dtype=np.float32))
    binding.bind_output("z", "cpu", 0, np.float32, [2, 2], small.ctypes.data)
    with pytest.raises(epctx.InvalidArgument, match="bound to memory of shape"):
        sess.run_with_iobinding(binding)
    value = epctx.OrtValue.ortvalue_from_shape_and_type([1], np.float32)
    binding.bind_ortvalue_output("z", value)
    sess.run_with_iobinding(binding)  # an OrtValue of another shape takes the result
    assert value.shape() == [8, 8]


def test_run_async_runs_on_another_thread(tmp_path):
    sess = epctx.InferenceSession(_model(tmp_path))
    done, seen = threading.Event(), {}

    def callback(outputs, user_data, err):
        seen.update(thread=threading.current_thread(), outputs=outputs, user_data=user_data, err=err)
        done.set()

    x = np.eye(8, dtype=np.float32)
    sess.run_async(None, {"x": x}, callback, 5)
    assert done.wait(30)
    assert seen["thread"] is not threading.current_thread() and seen["user_data"] == 5 and seen["err"] == ""
    np.testing.assert_array_equal(seen["outputs"][0], x)


def test_onnxruntime_exception_classes_are_epctx_errors():
    from epctx.capi import onnxruntime_pybind11_state as state

    for name in state.__all__:
        assert issubclass(getattr(state, name), EPCtxError), name
    assert state.Fail is epctx.Fail and epctx.OrtCompileApiFlags is epctx.CompileFlags


def test_optimized_model_is_written_in_onnx_format_only(tmp_path):
    so = epctx.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.ort")
    with pytest.raises(epctx.InvalidArgument, match="ORT format"):
        epctx.InferenceSession(_model(tmp_path), so)
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        epctx.InferenceSession(_model(tmp_path), so)
    onnx.checker.check_model(onnx.load(tmp_path / "opt.onnx"))
