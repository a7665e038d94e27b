"""partition_model: a partition extracted as a standalone ONNX model computes what the full model computes."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from benchmarks.models import example_inputs, mlp, resnet18, transformer
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from epctx.ep._contract import make_partition
from epctx.ep._onnx_export import partition_model
from epctx.ep._weights_file import plan_weights_file
from epctx.errors import InvalidArgument
from epctx.model.load import load_model

ort = pytest.importorskip("onnxruntime")

MODELS = {
    "mlp": (mlp, dict(batch=2, sizes=(12, 16, 16, 5))),
    "resnet18": (resnet18, dict(image=16, widths=(4, 8), blocks=(1, 1), num_classes=5)),
    "transformer": (transformer, dict(layers=2, hidden=16, heads=2, ffn=32, seq=4)),
}


def _all_values(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every graph input and node output of ``model``, computed by onnxruntime."""
    inferred = onnx.shape_inference.infer_shapes(model)
    full = onnx.ModelProto()
    full.CopyFrom(inferred)
    have = {o.name for o in full.graph.output}
    for info in inferred.graph.value_info:
        if info.name not in have:
            full.graph.output.append(info)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(full.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(feeds) | dict(zip(names, sess.run(names, feeds)))


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _check_partition(model: onnx.ModelProto, members_mask: list[bool], values: dict[str, np.ndarray]) -> None:
    loaded = load_model(model.SerializeToString(), infer_types=True).model
    nodes = list(loaded.graph)
    members = [n for n, keep in zip(nodes, members_mask) if keep]
    if not members:
        return
    opsets = dict(loaded.opset_imports)
    part = make_partition("p", "TestEP", loaded.graph, members, opsets)
    extracted = partition_model(part)
    onnx.checker.check_model(extracted)
    assert [i.name for i in extracted.graph.input] == [v.name for v in part.inputs]
    assert [o.name for o in extracted.graph.output] == [v.name for v in part.outputs]
    assert all(i.type.tensor_type.elem_type for i in extracted.graph.input)  # typed boundary
    if not part.outputs:
        return
    feeds = {v.name: values[v.name] for v in part.inputs if v.name}
    for got, value in zip(_run(extracted, feeds), part.outputs):
        np.testing.assert_allclose(got, values[value.name or ""], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_random_partitions_match_full_model(name: str) -> None:
    builder, sizes = MODELS[name]
    model = builder(**sizes)
    feeds = example_inputs(name, model)
    values = _all_values(model, feeds)
    rng = np.random.default_rng(7)
    count = len(model.graph.node)
    for _ in range(6):
        lo, hi = sorted(rng.integers(0, count + 1, 2))
        mask = [lo <= i < hi and rng.random() < 0.9 for i in range(count)]  # a range with holes: many cuts
        _check_partition(model, mask, values)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=64))
def test_any_node_subset_of_the_transformer(mask: list[bool]) -> None:
    model = _TRANSFORMER
    count = len(model.graph.node)
    _check_partition(model, (mask * (count // len(mask) + 1))[:count], _TRANSFORMER_VALUES)


_TRANSFORMER = transformer(layers=1, hidden=8, heads=2, ffn=16, seq=3)
_TRANSFORMER_VALUES = _all_values(_TRANSFORMER, example_inputs("transformer", _TRANSFORMER))


def _if_model() -> onnx.ModelProto:
    """x -> Relu -> If(cond) whose branches read the outer values ``r`` and ``W`` by name."""
    then_g = helper.make_graph(
        [helper.make_node("MatMul", ["r", "W"], ["t"])], "then", [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 4])],
    )  # fmt: skip
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["r"], ["e"])], "else", [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 4])],
    )  # fmt: skip
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g, name="if"),
    ]
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32) * 2, "W")
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_subgraph_outer_references_resolve() -> None:
    model = _if_model()
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(2, 4) - 3, "cond": np.array(True)}
    values = _all_values(model, feeds)
    _check_partition(model, [False, True], values)  # only the If: r and W come from outside
    loaded = load_model(model.SerializeToString(), infer_types=True).model
    part = make_partition("p", "T", loaded.graph, [list(loaded.graph)[1]], dict(loaded.opset_imports))
    assert [v.name for v in part.inputs] == ["cond", "r"] and [v.name for v in part.initializers] == ["W"]


def test_external_weights_file_at_known_offsets(tmp_path) -> None:
    model = mlp(batch=2, sizes=(12, 16, 5))
    feeds = example_inputs("mlp", model)
    expected = _run(model, feeds)
    loaded = load_model(model.SerializeToString(), infer_types=True).model
    part = make_partition("p", "T", loaded.graph, list(loaded.graph), dict(loaded.opset_imports))
    plan = plan_weights_file(part.initializers, location="w.bin", alignment=256, min_size=32)
    assert plan.refs and all(ref.offset % 256 == 0 for ref in plan.refs.values())
    small = [v.name for v in part.initializers if v.name not in plan.refs]
    assert small  # biases of 5 floats stay embedded
    extracted = partition_model(part, weights=plan.refs)
    path = plan.write(tmp_path)
    assert os.path.getsize(path) == plan.size
    with open(path, "rb") as fh:
        data = fh.read()
    for name, offset, array in plan.arrays:
        ref = plan.refs[name]
        assert (ref.offset, ref.length) == (offset, array.nbytes)
        assert data[offset : offset + array.nbytes] == array.tobytes()
    external = [t for t in extracted.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    assert sorted(t.name for t in external) == sorted(plan.refs)
    onnx.save(extracted, tmp_path / "m.onnx")
    so = ort.SessionOptions()
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), so, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, feeds)[0], expected[0], rtol=1e-5, atol=1e-5)


def test_source_external_data_is_embedded(tmp_path) -> None:
    model = mlp(batch=2, sizes=(12, 16, 5))
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    onnx.save(copy, tmp_path / "src.onnx", save_as_external_data=True, location="src.data", size_threshold=0)
    loaded = load_model(tmp_path / "src.onnx", infer_types=True).model
    part = make_partition("p", "T", loaded.graph, list(loaded.graph), dict(loaded.opset_imports))
    extracted = partition_model(part)
    assert all(t.data_location != TensorProto.EXTERNAL for t in extracted.graph.initializer)
    feeds = example_inputs("mlp", model)
    np.testing.assert_allclose(_run(extracted, feeds)[0], _run(model, feeds)[0], rtol=1e-6, atol=1e-6)


def test_bad_plan_arguments() -> None:
    with pytest.raises(InvalidArgument, match="power of two"):
        plan_weights_file((), location="w.bin", alignment=3)
    with pytest.raises(InvalidArgument, match="plain file name"):
        plan_weights_file((), location="../w.bin")
