"""Asking for no output, as onnxruntime answers it: ``run([])`` and ``run(None)`` give every output; a model with
no graph outputs loads, and running it is InvalidArgument "At least one output should be requested." (checked
against onnxruntime itself, which refuses it so at run, not at load)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import epctx
from epctx.errors import InvalidArgument

X = np.arange(4, dtype=np.float32) - 2


def _relu(with_output: bool) -> bytes:
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])] if with_output else []
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        outputs,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_empty_output_names_mean_every_output_as_onnxruntime() -> None:
    ort = pytest.importorskip("onnxruntime")
    expected = ort.InferenceSession(_relu(True), providers=["CPUExecutionProvider"]).run([], {"x": X})
    sess = epctx.InferenceSession(_relu(True))
    for names in ([], None):
        got = sess.run(names, {"x": X})
        assert len(got) == len(expected) == 1
        np.testing.assert_array_equal(got[0], expected[0])


def test_a_model_without_outputs_is_refused_at_run_as_onnxruntime() -> None:
    ort = pytest.importorskip("onnxruntime")
    theirs = ort.InferenceSession(_relu(False), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="At least one output should be requested") as their_error:
        theirs.run(None, {"x": X})
    assert "INVALID_ARGUMENT" in str(their_error.value)
    sess = epctx.InferenceSession(_relu(False))  # loads, as onnxruntime's does
    assert sess.get_outputs() == []
    for run in (
        lambda: sess.run(None, {"x": X}),
        lambda: sess.run([], {"x": X}),
        lambda: sess.run_with_ort_values(None, {"x": epctx.OrtValue.ortvalue_from_numpy(X)}),
    ):
        with pytest.raises(InvalidArgument, match="^.*At least one output should be requested\\.$"):
            run()
    with pytest.raises(
        InvalidArgument, match="missing input 'x'"
    ):  # the feed is checked first, as onnxruntime
        sess.run(None, {})
