"""The IREE EP returns the groups its capability check compiled (``Capability.groups``), and the partitioner makes
each one partition: what IREE probed is what it is asked to compile, nothing compiled twice.

The model is PP-OCR's recognizer from ``rapidocr_onnxruntime`` (a Paddle export, 860 nodes), where a candidate set
that compiled whole was once split by the partitioner into partitions nobody had compiled. Here the example EP
ahead of IREE takes the recognizer's two Relu nodes (in its squeeze-and-excitation blocks, mid-backbone): IREE is told which
nodes it took (``CapabilityContext.assigned``) and forms its groups around them."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import epctx
from epctx.ep import Capability, CapabilityContext, Partition
from epctx.providers.iree import compile as iree_compile
from epctx.providers.iree import probing as probing  # bound to the real compile before the test patches it
from epctx.providers.iree.provider import IREEExecutionProvider
from tests.oracle import run_ort
from tests.requires import requires

pytestmark = [pytest.mark.slow, requires("iree.runtime", "iree.compiler", "rapidocr_onnxruntime")]

EP = "IREEExecutionProvider"
EXAMPLE = "ExampleExecutionProvider"


def _recognizer() -> onnx.ModelProto:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "models/ch_PP-OCRv4_rec_infer.onnx"
    if not path.is_file():
        pytest.skip("rapidocr_onnxruntime does not ship the PP-OCRv4 recognizer")
    model = onnx.load(path)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for dim, size in zip(dims, (1, 3, 48, 320)):  # a 48-pixel text line, as rapidocr feeds it
        dim.Clear()
        dim.dim_value = size
    # The example EP claims a node only when its values' types are known: onnx's inference states them. It also
    # leaves some values typed without a shape, which IREE's importer reads as rank 0 when such a value crosses
    # a partition boundary: one of the groups formed around the Relu nodes then fails to compile (IREE 3.x),
    # and IREE declines it (its check compiled it). Before the groups, the partitioner split IREE's checked
    # set there and the session failed with EPFail, compiling a partition nobody had checked.
    return onnx.shape_inference.infer_shapes(model)


def test_iree_compiles_exactly_the_groups_it_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    capabilities: list[tuple[Capability, frozenset[str]]] = []
    asked: list[list[Partition]] = []  # the partitions IREE's compile had to compile afresh
    check = IREEExecutionProvider.get_capability
    compile_fresh = iree_compile.compile_partitions

    def get_capability(self: Any, graph: Any, opsets: Any, ctx: CapabilityContext) -> Capability:
        capability = check(self, graph, opsets, ctx)
        capabilities.append((capability, frozenset(n.name or "" for n in ctx.assigned)))
        return capability

    def fresh(partitions: Sequence[Partition], *args: Any, **kwargs: Any) -> Any:
        asked.append(list(partitions))
        return compile_fresh(partitions, *args, **kwargs)

    monkeypatch.setattr(IREEExecutionProvider, "get_capability", get_capability)
    monkeypatch.setattr(iree_compile, "compile_partitions", fresh)  # provider.compile imports it when called
    model = _recognizer()
    relu = {n.name for n in model.graph.node if n.op_type == "Relu"}
    assert len(relu) == 2
    sess = epctx.InferenceSession(model.SerializeToString(), providers=[(EXAMPLE, {"ops": "Relu"}), EP])

    ((capability, assigned),) = capabilities
    assert assigned == relu  # IREE was told what the example EP took
    assert not relu & {n.name for n in capability.nodes}
    groups = {frozenset(n.name for n in g) for g in capability.groups}
    assert len(groups) >= 2 and not capability.claimed  # IREE's own groups, none left for the framework
    assert all(frozenset(g) in capability.artefacts.compiled for g in capability.groups)  # each one compiled
    placed = sess.get_partitions()
    iree_parts = [frozenset(names) for ep, names in placed if ep == EP]
    # The partitioner honoured every group (one partition each), except those the cost rule left to the CPU EP
    assert iree_parts and set(iree_parts) <= groups
    refused = groups - set(iree_parts)
    reasons = sess.get_fallback_reasons()
    assert all(reasons[name][EP].startswith("cost rule: ") for g in refused for name in g)
    assert asked == [[]]  # IREE's compile reused its checks: nothing compiled afresh
    assert {ep for ep, names in placed if names[0] in relu} == {EXAMPLE}

    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, size=(1, 3, 7, 41))
    image = np.kron(pixels, np.ones((1, 1, 8, 8)))[:, :, :48, :320]
    feeds = {model.graph.input[0].name: ((image / 255.0 - 0.5) / 0.5).astype(np.float32)}
    (got,), (expected,) = sess.run(None, feeds), run_ort(model, feeds)
    assert got.shape == expected.shape and float(np.max(np.abs(got - expected))) <= 1e-3
