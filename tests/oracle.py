"""onnxruntime (CPU) as the numeric oracle: run a model on epctx and on onnxruntime and compare."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

import epctx


def run_epctx(model: onnx.ModelProto | bytes, feeds: Mapping[str, Any], **kwargs: Any) -> list[Any]:
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return epctx.InferenceSession(data, **kwargs).run(None, dict(feeds))


def run_ort(model: onnx.ModelProto | bytes, feeds: Mapping[str, Any]) -> list[Any]:
    import onnxruntime as ort

    data = model if isinstance(model, bytes) else model.SerializeToString()
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, dict(feeds))


def assert_matches_ort(
    model: onnx.ModelProto | bytes, feeds: Mapping[str, Any], *, atol: float = 1e-5, rtol: float = 1e-5
) -> list[Any]:
    """Run both and assert every output matches in dtype, shape and value. Returns epctx's outputs."""
    ours = run_epctx(model, feeds)
    theirs = run_ort(model, feeds)
    assert len(ours) == len(theirs)
    for k, (a, b) in enumerate(zip(ours, theirs)):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype, f"output {k}: dtype {a.dtype} != onnxruntime {b.dtype}"
        assert a.shape == b.shape, f"output {k}: shape {a.shape} != onnxruntime {b.shape}"
        if a.dtype.kind in "fc":
            np.testing.assert_allclose(a, b, atol=atol, rtol=rtol, err_msg=f"output {k}")
        else:
            np.testing.assert_array_equal(a, b, err_msg=f"output {k}")
    return ours


def graph_inputs_for(
    inputs: Sequence[Any], const: Sequence[int] = ()
) -> tuple[list[str], list[onnx.ValueInfoProto], list[onnx.TensorProto], dict[str, np.ndarray]]:
    """For a one-node test model: input names (``""`` for an omitted optional input), graph inputs, initializers
    (the positions in ``const``) and the feed. Input ``k`` is named ``in{k}``."""
    from onnx import helper, numpy_helper

    arrays = [None if v is None else np.asarray(v) for v in inputs]
    names = ["" if v is None else f"in{k}" for k, v in enumerate(arrays)]
    graph_inputs: list[onnx.ValueInfoProto] = []
    inits: list[onnx.TensorProto] = []
    feeds: dict[str, np.ndarray] = {}
    for k, (name, value) in enumerate(zip(names, arrays)):
        if value is None:
            continue
        if k in const:
            inits.append(numpy_helper.from_array(value, name))
        else:
            elem = helper.np_dtype_to_tensor_dtype(value.dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, elem, value.shape))
            feeds[name] = value
    return names, graph_inputs, inits, feeds
