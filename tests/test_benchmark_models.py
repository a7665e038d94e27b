"""The benchmark model builders produce valid models (tiny sizes; no timing)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import onnx
import pytest
from benchmarks import bench_cpu
from benchmarks.models import MODELS, example_inputs, identity, mlp, resnet18, save, transformer

TINY: dict[str, dict[str, Any]] = {
    "mlp": {"batch": 2, "sizes": (8, 16, 16, 4)},
    "resnet18": {"image": 32, "widths": (4, 8, 8, 8), "num_classes": 10},
    "transformer": {"layers": 2, "hidden": 16, "heads": 2, "ffn": 32, "seq": 5},
    "identity": {},
}


def _declared_shape(value: onnx.ValueInfoProto) -> list[int]:
    return [d.dim_value for d in value.type.tensor_type.shape.dim]


def _run_ort(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)


def test_every_model_has_a_tiny_size() -> None:
    assert set(TINY) == set(MODELS)


@pytest.mark.parametrize("name", sorted(TINY))
def test_builder_makes_a_valid_model(name: str) -> None:
    model = MODELS[name](**TINY[name])
    assert model.opset_import[0].version == 17
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    inferred_outputs = {v.name: _declared_shape(v) for v in inferred.graph.output}
    feeds = example_inputs(name, model)
    assert set(feeds) == {i.name for i in model.graph.input}
    for value in model.graph.input:
        assert feeds[value.name].dtype == np.float32
        assert list(feeds[value.name].shape) == _declared_shape(value)
    outputs = _run_ort(model, feeds)
    for value, out in zip(model.graph.output, outputs):
        assert out.dtype == np.float32
        assert list(out.shape) == _declared_shape(value) == inferred_outputs[value.name]
        assert np.isfinite(out).all()
        assert 0 < np.abs(out).max() < 1e3  # weights are scaled so activations stay in a sane range


@pytest.mark.parametrize("name", sorted(TINY))
def test_builder_is_deterministic(name: str) -> None:
    first = MODELS[name](**TINY[name]).SerializeToString()
    assert first == MODELS[name](**TINY[name]).SerializeToString()
    model = MODELS[name](**TINY[name])
    a, b = example_inputs(name, model), example_inputs(name, model)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])


def test_seed_changes_weights() -> None:
    assert mlp(**TINY["mlp"], seed=0).SerializeToString() != mlp(**TINY["mlp"], seed=1).SerializeToString()


def test_resnet_layout() -> None:
    ops = Counter(n.op_type for n in resnet18(**TINY["resnet18"]).graph.node)
    # stem + 8 blocks x 2 convs + 3 downsample convs = 20 Conv, each with an unfolded BatchNormalization.
    assert ops["Conv"] == 20
    assert ops["BatchNormalization"] == 20
    assert ops["Add"] == 8
    assert ops["MaxPool"] == ops["GlobalAveragePool"] == ops["Gemm"] == 1


def test_transformer_layout() -> None:
    layers = 3
    ops = Counter(n.op_type for n in transformer(**{**TINY["transformer"], "layers": layers}).graph.node)
    assert ops["MatMul"] == 8 * layers  # Q, K, V, scores, context, output, FFN in, FFN out
    assert ops["LayerNormalization"] == 2 * layers
    assert ops["Softmax"] == ops["Erf"] == layers
    assert ops["Transpose"] == 4 * layers
    assert ops["Reshape"] == 4 * layers


def test_transformer_rejects_bad_heads() -> None:
    with pytest.raises(ValueError, match="multiple of heads"):
        transformer(hidden=10, heads=3)


def test_identity_model() -> None:
    model = identity()
    assert [n.op_type for n in model.graph.node] == ["Identity"]
    feeds = example_inputs("identity", model)
    np.testing.assert_array_equal(_run_ort(model, feeds)[0], feeds["input"])


def test_example_inputs_unknown_model() -> None:
    with pytest.raises(KeyError, match="unknown model"):
        example_inputs("nope", identity())


@pytest.mark.parametrize("external", [False, True])
def test_save(tmp_path: Any, external: bool) -> None:
    model = transformer(**TINY["transformer"])
    before = model.SerializeToString()
    path = tmp_path / "model.onnx"
    save(model, path, external_data=external)
    assert model.SerializeToString() == before  # the caller's model is untouched
    assert (tmp_path / "model.onnx.data").exists() == external
    loaded = onnx.load(str(path), load_external_data=False)
    onnx.checker.check_model(str(path))
    feeds = example_inputs("transformer", model)
    np.testing.assert_array_equal(_run_ort(str(path), feeds)[0], _run_ort(model, feeds)[0])
    if external:
        assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in loaded.graph.initializer)


def test_bench_helpers() -> None:
    stats = bench_cpu.summarize([0.001, 0.002, 0.003])
    assert stats["median_ms"] == pytest.approx(2.0)
    assert stats["runs"] == 3
    log = (
        "import time: self [us] | cumulative | imported package\n"
        "import time:       500 |        500 | numpy\n"
        "@@epctx-import-start@@\n"
        "import time:       100 |        100 |   onnx.helper\n"
        "import time:       300 |        400 | onnx\n"
        "import time:        50 |        450 | epctx\n"
    )
    assert bench_cpu._self_time_by_package(log) == pytest.approx({"onnx": 400e-6, "epctx": 50e-6})
    diff, scale = bench_cpu.max_abs_diff([np.array([1.0, 2.0])], [np.array([1.0, 2.5])])
    assert (diff, scale) == (0.5, 2.5)
