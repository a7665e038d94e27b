"""IREE with ``epctx.input_shapes`` (issue 21): a model whose input dimensions are anonymous (Paddle's ``?``
names height and width alike, ``-1`` the batch), stated whole, compiles as one partition whose inputs are all
static (no dynamic code), runs and matches onnxruntime; a feed of another shape is refused; a context model
compiled with ``epctx compile --shape`` loads warm (nothing compiled) and runs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from epctx.cli import main
from epctx.errors import InvalidArgument
from epctx.providers.iree.provider import IREEExecutionProvider
from epctx.testing import no_compile
from tests.oracle import run_ort
from tests.requires import requires

pytestmark = [pytest.mark.slow, requires("iree.runtime", "iree.compiler")]

EP = "IREEExecutionProvider"


def _anonymous_cnn() -> bytes:
    """x[-1, 3, '?', '?'] -> Conv -> Relu -> Conv -> GlobalAveragePool -> y, as PP-OCR's cls declares x."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.2, "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.2, "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("Conv", ["b", "w2"], ["c"], strides=[2, 2], name="conv2"),
        helper.make_node("GlobalAveragePool", ["c"], ["y"], name="pool"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "?", "?"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "anonymous_cnn", [x], [y], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _stated(shape: str) -> epctx.SessionOptions:
    so = epctx.SessionOptions()
    so.add_session_config_entry("epctx.input_shapes", shape)
    return so


def test_stated_shape_compiles_static_code_whole(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    data = _anonymous_cnn()
    seen: list[list[Any]] = []
    original = IREEExecutionProvider.compile

    def compile_(self: IREEExecutionProvider, partitions: Any, ctx: Any) -> Any:
        seen.extend([list(v.shape) if v.shape is not None else None for v in p.inputs] for p in partitions)
        return original(self, partitions, ctx)

    monkeypatch.setattr(IREEExecutionProvider, "compile", compile_)
    with caplog.at_level(logging.INFO, logger="epctx"):
        sess = epctx.InferenceSession(data, _stated("x[2,3,24,40]"), providers=[EP])
    assert sess.get_partitions() == [(EP, ["conv1", "relu", "conv2", "pool"])]
    assert seen == [[[2, 3, 24, 40]]]  # the compiled partition's input: every dimension static
    assert "dynamic dimensions" not in caplog.text
    x = np.random.default_rng(1).standard_normal((2, 3, 24, 40)).astype(np.float32)
    (got,) = sess.run(None, {"x": x})
    (expected,) = run_ort(data, {"x": x})
    assert got.shape == expected.shape == (2, 4, 1, 1)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    with pytest.raises(InvalidArgument, match="Got invalid dimensions for input: x"):
        sess.run(None, {"x": np.zeros((2, 3, 40, 24), np.float32)})


def test_compile_shape_context_loads_warm_and_runs(tmp_path: Path) -> None:
    source = tmp_path / "anon.onnx"
    source.write_bytes(_anonymous_cnn())
    out = tmp_path / "anon_ctx.onnx"
    assert main(["compile", str(source), "-p", EP, "--shape", "x[1,3,48,192]", "-o", str(out), "-q"]) == 0
    with no_compile():
        sess = epctx.InferenceSession(str(out), providers=[EP])
    assert sess.get_inputs()[0].shape == [1, 3, 48, 192]
    x = np.random.default_rng(2).standard_normal((1, 3, 48, 192)).astype(np.float32)
    (got,) = sess.run(None, {"x": x})
    (expected,) = run_ort(source.read_bytes(), {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
