"""IREE's code generation flags (``fast_codegen``: data tiling, microkernels, im2col convolutions, by default for
the partitions with one-dimensional convolutions; the depthwise rewrite, default) and the numbers they must keep: magika's shipped model (a 5x1 convolution over a width-1 image, where IREE's direct
convolution code took 84 ms a run and im2col + data tiling 13.5 ms; benchmarks/bench_iree_flags.py) against
onnxruntime, with the flags and without, stated and dynamic batch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest

import epctx
from epctx.errors import InvalidArgument
from epctx.providers.iree.compatibility import options_from_info
from epctx.providers.iree.options import FAST_1D_CONVS, FAST_CODEGEN, REWRITE_DEPTHWISE
from epctx.providers.iree.provider import IREEExecutionProvider
from tests.oracle import run_ort
from tests.requires import requires

EP = "IREEExecutionProvider"


def test_fast_codegen_is_auto_the_depthwise_rewrite_default_and_both_recorded() -> None:
    default = IREEExecutionProvider()
    assert not any(flag in default.flags() for flag in FAST_CODEGEN)
    assert FAST_1D_CONVS in default.flags() and REWRITE_DEPTHWISE in default.flags()
    fast = IREEExecutionProvider({"fast_codegen": "1", "depthwise_rewrite": "0"})
    assert all(flag in fast.flags() for flag in FAST_CODEGEN)
    assert FAST_1D_CONVS not in fast.flags() and REWRITE_DEPTHWISE not in fast.flags()
    never = IREEExecutionProvider({"fast_codegen": "0"})
    assert not any(flag in never.flags() for flag in (*FAST_CODEGEN, FAST_1D_CONVS))
    assert options_from_info(default.compatibility_info())["fast_codegen"] == "auto"
    assert options_from_info(default.compatibility_info())["depthwise_rewrite"] == "1"
    assert options_from_info(fast.compatibility_info())["fast_codegen"] == "1"
    assert options_from_info(fast.compatibility_info())["depthwise_rewrite"] == "0"
    with pytest.raises(InvalidArgument, match="fast_codegen"):
        IREEExecutionProvider({"fast_codegen": "maybe"})


@pytest.mark.parametrize(
    ("x", "w", "one_dimensional"),
    [
        ((1, 256, 512, 1), (512, 256, 5, 1), True),  # magika's: 5x1 over a 1-wide image
        ((1, 8, 1, 64), (8, 8, 1, 3), True),
        ((1, 8, 100), (8, 8, 3), True),  # Conv1D
        ((1, 8, 32, 32), (8, 8, 3, 3), False),
        ((1, 8, 1, 1), (8, 8, 1, 1), False),  # a 1x1 conv over a pooled 1x1 map (PP-OCR det's SE blocks)
        ((1, 8, 32, 1), (8, 8, 1, 1), False),
    ],
)
def test_the_fast_flags_go_to_jobs_with_one_dimensional_convolutions(
    x: tuple[int, ...], w: tuple[int, ...], one_dimensional: bool
) -> None:
    import onnx_ir as ir

    from epctx.ep import make_partition
    from epctx.providers.iree.compile import _job_flags

    xv = ir.Value(name="x", shape=ir.Shape(list(x)), type=ir.TensorType(ir.DataType.FLOAT))
    wv = ir.Value(name="w", shape=ir.Shape(list(w)), type=ir.TensorType(ir.DataType.FLOAT))
    node = ir.Node("", "Conv", [xv, wv], num_outputs=1)
    node.outputs[0].name = "y"
    graph = ir.Graph([xv, wv], node.outputs, nodes=[node], name="g", opset_imports={"": 17})
    part = make_partition("p", EP, graph, [node], {"": 17})
    flags = _job_flags(part, ["--a", FAST_1D_CONVS, REWRITE_DEPTHWISE])
    assert flags == ["--a", *FAST_CODEGEN] if one_dimensional else flags == ["--a"]
    assert _job_flags(part, ["--a"]) == ["--a"]


def _magika() -> onnx.ModelProto:
    spec = importlib.util.find_spec("magika")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("magika is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / "standard_v3_3" / "model.onnx"
    if not path.is_file():
        pytest.skip("magika does not ship models/standard_v3_3/model.onnx")
    return onnx.load(str(path))


@pytest.mark.slow  # compiles magika with IREE
@requires("iree.runtime", "iree.compiler")
@pytest.mark.parametrize("fast", ["auto", "1", "0"])
@pytest.mark.parametrize("batch", [1, None])  # stated, or as shipped (dynamic)
def test_magika_matches_onnxruntime(fast: str, batch: int | None) -> None:
    model = _magika()
    if batch is not None:
        dim = model.graph.input[0].type.tensor_type.shape.dim[0]
        dim.Clear()
        dim.dim_value = batch
    data = np.random.default_rng(0).integers(0, 257, (batch or 2, 2048)).astype(np.int32)
    sess = epctx.InferenceSession(model.SerializeToString(), providers=[(EP, {"fast_codegen": fast})])
    assert [ep for ep, _ in sess.get_partitions()] == [EP], sess.get_partitions()
    (got,) = sess.run(None, {"bytes": data})
    (expected,) = run_ort(model, {"bytes": data})
    assert got.shape == expected.shape
    assert float(np.max(np.abs(got - expected))) <= 1e-3


@pytest.mark.slow  # compiles MiniLM with IREE
@requires("iree.runtime", "iree.compiler")
def test_minilm_with_128_tokens_stated_compiles_whole() -> None:
    """all-MiniLM-L6-v2 with its shapes stated at 1 x 128 tokens: a dispatch needs 37 KB of stack, over IREE's
    default limit of 32 KiB (it ran on the CPU EP, every node declined); the EP allows 64 KiB."""
    from benchmarks import export_minilm

    if importlib.util.find_spec(export_minilm.PACKAGE) is None:
        pytest.skip(f"{export_minilm.PACKAGE} is not installed")
    model = export_minilm.minilm(batch=1, seq=128)
    feeds = export_minilm.example_inputs(batch=1, seq=128)
    sess = epctx.InferenceSession(model.SerializeToString(), providers=[EP])
    assert [ep for ep, _ in sess.get_partitions()] == [EP], sess.get_fallback_reasons()
    got, expected = sess.run(None, feeds), run_ort(model, feeds)
    assert max(float(np.max(np.abs(g - e))) for g, e in zip(got, expected)) <= 1e-3
