"""The EP contract as values (docs/ep-authors.md): capability returns a Capability, compile gets all partitions
of an EP in one call with a CompileContext (artefacts, progress, guard), and EPs written against the first
contract (nodes from get_capability, declined_nodes(), compile(partitions)) still work through the adapter."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import pytest

import epctx
from epctx.ep import Capability, CapabilityContext, CompileContext, CompiledPartition, Partition
from tests.epcontext.models import EXAMPLE, feed, two_partition_model
from tests.fusing_ep import _compile_one, make_fusing_ep, registered
from tests.oracle import run_ort

ProbingEP = make_fusing_ep(lambda n: n.op_type in ("MatMul", "Relu", "Add", "Sigmoid"), "TestProbingEP")


class _Probing(ProbingEP):  # type: ignore[valid-type,misc]
    """Claims like the fusing EP and returns an artefact; compile records what it is given."""

    seen: ClassVar[list[tuple[Any, int]]] = []

    def get_capability(
        self, graph: Any, opset_imports: Mapping[str, int], ctx: CapabilityContext
    ) -> Capability:
        claimed = super().get_capability(graph, opset_imports, ctx).claimed
        return Capability(claimed, {}, artefacts=("checked", len(claimed)))

    def compile(self, partitions: Sequence[Partition], ctx: CompileContext) -> list[CompiledPartition]:
        type(self).seen.append((ctx.artefacts, len(partitions)))
        for partition in partitions[::-1]:  # reported out of order: the framework counts them as they come
            ctx.progress(partition)
        return super().compile(partitions, ctx)


def test_all_partitions_of_an_ep_compile_in_one_call_with_its_artefacts(caplog):
    model = two_partition_model()
    _Probing.seen.clear()
    with registered(_Probing), caplog.at_level(logging.INFO, logger="epctx"):
        sess = epctx.InferenceSession(
            model.SerializeToString(), providers=[_Probing.name, "CPUExecutionProvider"]
        )
    assert _Probing.seen == [(("checked", 5), 2)]  # the two partitions around the CPU LayerNormalization
    assert _Probing.calls == [2]
    done = [r.getMessage() for r in caplog.records if r.getMessage().startswith("compiled partition")]
    assert [m.split()[2] for m in done] == ["1/2", "2/2"]
    np.testing.assert_allclose(sess.run(None, feed())[0], run_ort(model, feed())[0], rtol=1e-5, atol=1e-5)


def test_a_session_that_must_not_compile_never_calls_compile():
    ep = make_fusing_ep(lambda n: n.op_type == "Relu", "TestGuardedEP")
    so = epctx.SessionOptions()
    so.add_session_config_entry("session.disable_model_compile", "1")
    with (
        registered(ep),
        pytest.raises(epctx.ModelRequiresCompilation, match="TestGuardedEP was asked to compile 1"),
    ):
        epctx.InferenceSession(two_partition_model().SerializeToString(), so, providers=[ep.name])
    assert ep.calls == []


class _FirstContractEP(epctx.ep.ExecutionProvider):
    """Written against the first contract: no contexts, nodes out, declined_nodes(), compile(partitions)."""

    name = "TestFirstContractEP"
    compiles = True
    compiled: ClassVar[list[int]] = []

    def get_capability(self, graph, opset_imports):  # type: ignore[no-untyped-def,override]
        self._graph = graph  # state between the calls, as the first contract allowed
        return [n for n in graph if n.op_type in ("MatMul", "Relu")]

    def declined_nodes(self):  # type: ignore[no-untyped-def]
        return {n: "not a MatMul or a Relu" for n in self._graph if n.op_type == "Sigmoid"}

    def compile(self, partitions):  # type: ignore[no-untyped-def,override]
        type(self).compiled.append(len(partitions))
        return [_compile_one(p) for p in partitions]


def test_an_ep_of_the_first_contract_works_through_the_adapter():
    model = two_partition_model()
    with registered(_FirstContractEP):
        sess = epctx.InferenceSession(model.SerializeToString(), providers=[_FirstContractEP.name])
    assert _FirstContractEP.compiled == [2]
    assert sess.get_fallback_reasons() == {"sig": {_FirstContractEP.name: "not a MatMul or a Relu"}}
    np.testing.assert_allclose(sess.run(None, feed())[0], run_ort(model, feed())[0], rtol=1e-5, atol=1e-5)


def test_example_ep_compiles_its_partitions_in_one_call(monkeypatch):
    from epctx.providers.example import ExampleExecutionProvider

    calls: list[int] = []
    original = ExampleExecutionProvider.compile

    def spy(self: Any, partitions: Sequence[Partition], ctx: CompileContext) -> Any:
        calls.append(len(partitions))
        return original(self, partitions, ctx)

    monkeypatch.setattr(ExampleExecutionProvider, "compile", spy)
    epctx.InferenceSession(two_partition_model().SerializeToString(), providers=[EXAMPLE])
    assert calls == [2]
