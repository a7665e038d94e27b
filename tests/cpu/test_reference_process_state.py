"""Ops the CPU EP runs through onnx.reference leave the process as they found it: StringNormalizer's reference
implementation calls setlocale(LC_ALL, <its locale attribute>) and left it set, so after such a model ran the
user's default text encoding changed (open() without an encoding turned ASCII under locale "C")."""

from __future__ import annotations

import locale
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto

import epctx
from tests.oracle import run_ort


def _normalizer(locale_name: str) -> onnx.ModelProto:
    node = oh.make_node(
        "StringNormalizer", ["x"], ["y"], case_change_action="UPPER", locale=locale_name, stopwords=["a"]
    )
    graph = oh.make_graph(
        [node], "g",
        [oh.make_tensor_value_info("x", TensorProto.STRING, [3])],
        [oh.make_tensor_value_info("y", TensorProto.STRING, None)],
    )  # fmt: skip
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 19)])


@pytest.mark.parametrize("locale_name", ["C", "C.UTF-8"])
def test_string_normalizer_leaves_the_locale_as_it_was(tmp_path: Path, locale_name: str) -> None:
    before = locale.setlocale(locale.LC_ALL)
    encoding = locale.getpreferredencoding(False)
    model = _normalizer(locale_name)
    onnx.save(model, tmp_path / "m.onnx")
    sess = epctx.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    feed = {"x": np.array(["a", "b", "c"], dtype=object)}
    (got,) = sess.run(None, feed)
    np.testing.assert_array_equal(got, run_ort(model, feed)[0])
    assert locale.setlocale(locale.LC_ALL) == before
    assert locale.getpreferredencoding(False) == encoding
