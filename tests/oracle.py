"""onnxruntime (CPU) as the numeric oracle: run a model on epctx and on onnxruntime and compare."""

from __future__ import annotations

from collections.abc import Mapping
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
