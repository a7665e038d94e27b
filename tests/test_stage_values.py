"""Stage results as values (issue 17): loading, partitioning, compiling / context loading and planning each return
a frozen value the next stage reads, and both load paths produce the same ``PreparedSession`` that
``InferenceSession`` adopts."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import epctx
import epctx.session.lean
from epctx.model.lean import read_context_model
from epctx.session.pipeline import Pipeline, resolve_providers
from epctx.session.prepared import PreparedSession
from epctx.session.stages import CompiledUnits, Partitioning
from tests.epcontext.models import EXAMPLE, feed, two_partition_model, whole_model
from tests.oracle import run_ort

OPENVINO = "OpenVINOExecutionProvider"
HAS_OPENVINO = importlib.util.find_spec("openvino") is not None


def _context_model(folder: Path, ep: str, embed: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "model.onnx"
    onnx.save(whole_model(), source)
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_embed_mode", str(embed))
    epctx.InferenceSession(str(source), so, providers=[ep])
    return folder / "model_ctx.onnx"


def _prepared(session: epctx.InferenceSession) -> PreparedSession:
    prepared = session._prepared
    assert isinstance(prepared, PreparedSession)
    return prepared


def _spec(spec: Any) -> tuple[Any, ...]:
    default = None if spec.default is None else spec.default.tolist()
    return (spec.name, spec.type, spec.dtype, spec.rank, spec.dims, default)


def _fields(prepared: PreparedSession) -> dict[str, Any]:
    """Every field of the value but the model loaded (the lean path loads none) and the plan (compared by its
    layout and by running it)."""
    plan = prepared.plan
    return {
        "inputs": prepared.inputs,
        "outputs": prepared.outputs,
        "overridable": prepared.overridable,
        "specs": [_spec(s) for s in prepared.specs],
        "partitions": prepared.partitions,
        "declined": {k: dict(v) for k, v in prepared.declined.items()},
        "metadata": prepared.metadata,
        "placement": [p.to_dict() for p in prepared.node_placement()],
        "output_index": dict(prepared.output_index),
        "plan": (plan.num_slots, plan.input_slots, plan.output_slots, len(plan.steps), plan.info),
    }


@pytest.mark.parametrize(("ep", "embed"), [(EXAMPLE, 0), (EXAMPLE, 1), (OPENVINO, 0)])
def test_both_load_paths_prepare_the_same_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ep: str, embed: int
) -> None:
    if ep == OPENVINO and not HAS_OPENVINO:
        pytest.skip("OpenVINO is not installed")
    path = _context_model(tmp_path, ep, embed)
    assert read_context_model(path.read_bytes()) is not None, "the lean reader declined the context model"
    lean = _prepared(epctx.InferenceSession(str(path), providers=[ep]))
    monkeypatch.setattr(epctx.session.lean, "read_context_model", lambda data: None)  # the full loader now
    full = _prepared(epctx.InferenceSession(str(path), providers=[ep]))
    assert lean.loaded is None and lean.placement is None  # the lean path loaded nothing with onnx-ir
    assert full.loaded is not None and full.placement is not None
    assert _fields(lean) == _fields(full)
    assert [p[0] for p in lean.partitions] == [ep]
    x = feed(seed=2)
    for got, want in zip(lean.plan.run([x["x"]]), full.plan.run([x["x"]]), strict=True):
        np.testing.assert_array_equal(got, want)


def test_the_session_answers_from_its_prepared_value(tmp_path: Path) -> None:
    """InferenceSession's introspection reads the one value it adopted (a model the example EP and the CPU EP
    share; the reasons EPs decline nodes with are tested through it in test_partition_cost_rule.py)."""
    source = tmp_path / "two.onnx"
    onnx.save(two_partition_model(), source)
    session = epctx.InferenceSession(str(source), providers=[EXAMPLE])
    prepared = _prepared(session)
    assert session.get_inputs() == list(prepared.inputs)
    assert session.get_outputs() == list(prepared.outputs)
    assert session.get_partitions() == [(ep, list(nodes)) for ep, nodes in prepared.partitions]
    assert {ep for ep, _ in session.get_partitions()} == {EXAMPLE, "CPUExecutionProvider"}
    assert session.get_fallback_reasons() == {k: dict(v) for k, v in prepared.declined.items()}
    assert session.get_node_placement() == list(prepared.node_placement())
    assert session.get_modelmeta() is prepared.metadata
    assert session.model is prepared.loaded.model  # type: ignore[union-attr]


def _pipeline() -> Pipeline:
    """The pipeline of a session on the example EP, the CPU EP after it (as InferenceSession resolves them)."""
    options = epctx.SessionOptions()
    return Pipeline.of(resolve_providers([EXAMPLE], None, options), options)


def _stages(source: Path) -> tuple[Pipeline, Any, Partitioning, CompiledUnits, PreparedSession]:
    pipeline = _pipeline()
    loaded = pipeline.load(str(source))
    partitioning = pipeline.partition(loaded)
    compiled = pipeline.compile(partitioning)
    return pipeline, loaded, partitioning, compiled, pipeline.plan(compiled)


def test_each_stage_returns_a_frozen_value_the_next_stage_reads(tmp_path: Path) -> None:
    source = tmp_path / "two.onnx"
    onnx.save(two_partition_model(), source)
    pipeline, loaded, partitioning, compiled, prepared = _stages(source)
    for value in (pipeline, loaded, partitioning, compiled, prepared):
        field = dataclasses.fields(value)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, field, None)
    for mapping in (
        partitioning.routed,
        partitioning.declined,
        partitioning.artefacts,
        compiled.compiled,
        prepared.declined,
        prepared.output_index,
    ):
        with pytest.raises(TypeError):
            mapping["x"] = None  # type: ignore[index]
    assert isinstance(partitioning.units, tuple) and isinstance(compiled.partitions, tuple)
    assert isinstance(prepared.inputs, tuple) and isinstance(prepared.partitions, tuple)
    # Each stage reads the value before it, and hands it on unchanged.
    assert partitioning.loaded is loaded and compiled.partitioning.loaded is loaded
    assert compiled.partitioning.units == partitioning.units
    assert prepared.loaded is loaded
    # One compiled partition per fused unit, none for the CPU EP's nodes; all compiled by this session.
    fused = [k for k, u in enumerate(partitioning.units) if u.partition is not None]
    assert fused and [k for k, p in enumerate(compiled.partitions) if p is not None] == fused
    assert sorted(compiled.compiled) == fused
    assert partitioning.to_compile == tuple(partitioning.units[k] for k in fused)


def test_the_compile_stage_hands_on_the_partitioning_without_its_artefacts(tmp_path: Path) -> None:
    """The capability artefacts (compiled code, e.g. IREE's probes) go to the compile and no further."""
    source = tmp_path / "two.onnx"
    onnx.save(two_partition_model(), source)
    pipeline = _pipeline()
    partitioning = pipeline.partition(pipeline.load(str(source)))
    probe = object()
    with_artefacts = dataclasses.replace(partitioning, artefacts={id(pipeline.providers[0]): probe})
    compiled = pipeline.compile(with_artefacts)
    assert dict(with_artefacts.artefacts) == {id(pipeline.providers[0]): probe}  # the input is unchanged
    assert dict(compiled.partitioning.artefacts) == {}


def test_a_session_compiled_again_from_the_same_partitioning_is_a_new_value(tmp_path: Path) -> None:
    """Nothing is filled in place: compiling and planning twice from one partitioning gives two independent
    values, each running as onnxruntime (the oracle) does."""
    source = tmp_path / "two.onnx"
    onnx.save(two_partition_model(), source)
    pipeline, _, partitioning, first, prepared = _stages(source)
    second = pipeline.compile(partitioning)
    assert second is not first and second.partitioning == first.partitioning
    assert all(
        (a is None) == (b is None) and (a is None or a is not b)
        for a, b in zip(first.partitions, second.partitions, strict=True)
    )
    again = pipeline.plan(second)
    x = feed(seed=3)
    inputs = [x[spec.name] for spec in prepared.specs]
    (want,) = run_ort(two_partition_model(), x)
    for plan in (prepared.plan, again.plan):
        (got,) = plan.run(inputs)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
