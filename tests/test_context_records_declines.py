"""A context model records why each compiling EP declined the nodes left out of its partitions (metadata
``epctx.measured_refusals``, with the measured rule's hand-backs): a warm load refuses them to that EP again, so
it asks no compiling EP about nodes it declined when the context was made (IREE probed for 16 s again on a warm
load of ppocr_det's context model, whose every node it had declined)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import epctx
from epctx.ep import Capability, CapabilityContext
from epctx.partition.measured import FROM_CONTEXT, REFUSALS_KEY
from epctx.providers.example.provider import ExampleExecutionProvider
from epctx.testing import no_compile
from tests.fusing_ep import registered
from tests.oracle import run_ort
from tests.test_measured_rule_context import _model

EP = "DecliningExampleExecutionProvider"
CPU = "CPUExecutionProvider"
WHY = "this test EP declines Neg"


class DecliningExample(ExampleExecutionProvider):
    """The Example EP declining Neg with a reason; records the nodes shown to it as taken, per request."""

    name = EP
    asked: list[set[str]] = []

    def get_capability(self, graph: Any, opset_imports: Any, ctx: CapabilityContext) -> Capability:
        type(self).asked.append({n.name or "" for n in ctx.assigned})
        found = super().get_capability(graph, opset_imports, ctx)
        declined = {node: WHY for node in graph if node.op_type == "Neg" and node not in ctx.assigned}
        return Capability(found.claimed, {**found.declined, **declined}, found.artefacts, found.groups)


def _session(model: str | Path, **config: str) -> epctx.InferenceSession:
    so = epctx.SessionOptions()
    so.add_session_config_entry("epctx.partition.cost_rule", "0")
    so.add_session_config_entry("epctx.partition.measured_rule", "0")
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    with registered(DecliningExample):
        return epctx.InferenceSession(str(model), so, providers=[EP, CPU])


@pytest.fixture
def context(tmp_path: Path) -> Path:
    source, ctx = tmp_path / "model.onnx", tmp_path / "model_ctx.onnx"
    onnx.save(_model(), source)
    cold = _session(source, **{"ep.context_enable": "1", "ep.context_file_path": str(ctx)})
    assert cold.get_partitions() == [(EP, ["matmul", "relu"]), (CPU, ["neg"]), (EP, ["matmul2", "tanh"])]
    assert cold.get_fallback_reasons() == {"neg": {EP: WHY}}
    return ctx


def test_the_context_records_a_compiling_eps_decline(context: Path) -> None:
    record = {p.key: p.value for p in onnx.load(context).metadata_props}[REFUSALS_KEY]
    assert json.loads(record) == {EP: {"neg": WHY}}


def test_a_warm_load_does_not_ask_again_about_a_declined_node(context: Path) -> None:
    DecliningExample.asked.clear()
    with no_compile():
        warm = _session(context)
    assert all("neg" in shown for shown in DecliningExample.asked), DecliningExample.asked  # shown as taken
    assert warm.get_fallback_reasons() == {"neg": {EP: FROM_CONTEXT + WHY}}
    placed = {p.name: p for p in warm.get_node_placement()}
    assert placed["neg"].provider == CPU and placed["neg"].declined == ((EP, FROM_CONTEXT + WHY),)
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(warm.run(None, {"x": x})[0], run_ort(_model(), {"x": x})[0], rtol=1e-5)


def test_a_kernel_eps_session_records_nothing(tmp_path: Path) -> None:
    """Without a compiling EP nothing is declined that a warm load would ask again: no record."""
    source, ctx = tmp_path / "model.onnx", tmp_path / "model_ctx.onnx"
    onnx.save(_model(), source)
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_file_path", str(ctx))
    epctx.InferenceSession(str(source), so, providers=[CPU])
    if ctx.exists():
        assert REFUSALS_KEY not in {p.key for p in onnx.load(ctx).metadata_props}
