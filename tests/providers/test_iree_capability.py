"""The IREE EP's capability check (``providers/iree/capability.py``) with IREE's compiles stood in for by a rule:
which node sets "compile". The real compiles are tested in ``test_iree_ep.py``; here, the bisection and the
check that what was claimed apart also compiles together, whatever IREE's reasons."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from epctx.ep import CompileGuard, Partition
from epctx.providers.iree import capability
from epctx.providers.iree.compile import CompileResult

EP = "IREEExecutionProvider"


def _relu_chain(n: int) -> ir.Graph:
    names = [f"r{k}" for k in range(n)]
    values = ["x", *[f"v{k}" for k in range(n - 1)], "y"]
    nodes = [helper.make_node("Relu", [values[k]], [values[k + 1]], name=names[k]) for k in range(n)]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ir.serde.deserialize_model(model).graph


def _check(
    monkeypatch: pytest.MonkeyPatch, graph: ir.Graph, compiles: Callable[[set[str]], bool]
) -> tuple[capability.Verdict, list[set[str]]]:
    asked: list[set[str]] = []

    def fake(
        partitions: Sequence[Partition], flags: Sequence[str], guard: CompileGuard, **_: object
    ) -> list[CompileResult]:
        guard.check(EP, len(partitions), "for its capability check")
        results = []
        for p in partitions:
            names = {n.name or "" for n in p.nodes}
            asked.append(names)
            ok = compiles(names)
            results.append(CompileResult(ok, stage="" if ok else "compile", error="" if ok else "error: no"))
        return results

    monkeypatch.setattr(capability, "compile_partitions", fake)
    verdict = capability.check_nodes(EP, graph, {"": 17}, list(graph), [], CompileGuard())
    return verdict, asked


def test_a_node_iree_cannot_compile_is_declined_and_the_rest_checked_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    verdict, asked = _check(monkeypatch, _relu_chain(4), lambda names: "r2" not in names)
    assert [n.name for n in verdict.claimed] == ["r0", "r1", "r3"]
    assert {n.name for n in verdict.declined} == {"r2"}
    assert asked[-1] == {"r0", "r1", "r3"}  # the claimed set compiled as one, as the framework will ask
    assert frozenset(verdict.claimed) in verdict.compiled


def test_groups_that_compile_apart_but_not_together_are_declined(monkeypatch: pytest.MonkeyPatch) -> None:
    # IREE fails on r1 and r2 in one module, compiles each alone: the whole set fails, both halves compile.
    verdict, _ = _check(monkeypatch, _relu_chain(4), lambda names: not {"r1", "r2"} <= names)
    assert [n.name for n in verdict.claimed] == ["r0", "r1"]
    assert {n.name for n in verdict.declined} == {"r2", "r3"}
    why = verdict.declined[next(n for n in verdict.declined if n.name == "r2")]
    assert why.startswith("IREE compile failed: error: no") and "not with the nodes before them" in why
    assert frozenset(verdict.claimed) in verdict.compiled


def test_a_set_that_compiles_whole_is_compiled_once(monkeypatch: pytest.MonkeyPatch) -> None:
    verdict, asked = _check(monkeypatch, _relu_chain(3), lambda names: True)
    assert (
        len(asked) == 1 and [n.name for n in verdict.claimed] == ["r0", "r1", "r2"] and not verdict.declined
    )
