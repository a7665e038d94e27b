"""An EP's node groups (``Capability.groups``): each is one partition, never merged with another group nor with the
EP's flat claim, split only when it must be (EPs ahead took some of its nodes, or a path leaves it and comes back:
then into its largest cycle-free parts), and a bad group (a node twice, a node not in the graph) is EPFail naming
the EP. Sessions run against onnxruntime; the property test checks random groupings structurally."""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Sequence
from typing import Any

import onnx_ir as ir
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

import epctx
from epctx.ep import Capability, CapabilityContext, fused_groups
from epctx.errors import EPFail
from epctx.model import load_model
from epctx.partition import GraphPartitioner, Unit
from epctx.providers.cpu.provider import CPUExecutionProvider
from tests.fusing_ep import FusingEP, make_fusing_ep, registered
from tests.oracle import run_ort
from tests.test_partitioner import (
    _assert_close,
    _by_name,
    _check_structure,
    _Dag,
    _feeds,
    _model,
    _node_names,
    _random_case,
    _session,
)

Groups = Sequence[Collection[str]]


def _grouping_ep(name: str, groups: Groups, claimed: Collection[str] = ()) -> type[FusingEP]:
    """A compiling test EP that returns ``groups`` (node names) as its groups and ``claimed`` as flat claims; the
    contexts it was asked with are kept in ``contexts``."""
    base = make_fusing_ep(_by_name(claimed), name)
    contexts: list[CapabilityContext] = []

    def get_capability(self: Any, graph: ir.Graph, opset_imports: Any, ctx: CapabilityContext) -> Capability:
        contexts.append(ctx)
        by_name = {node.name: node for node in graph}
        return Capability(
            tuple(n for n in graph if n.name in claimed),
            groups=tuple(tuple(by_name[x] for x in sorted(g)) for g in groups),
        )

    return type(base.__name__, (base,), {"get_capability": get_capability, "contexts": contexts})


def _chain(n: int) -> bytes:
    """x -> n0 -> n1 -> ... -> y (Relu, Neg, Abs in turn)."""
    ops = ("Relu", "Neg", "Abs")
    values = ["x", *[f"v{k}" for k in range(n - 1)], "y"]
    nodes = [helper.make_node(ops[k % 3], [values[k]], [values[k + 1]], name=f"n{k}") for k in range(n)]
    return _model(nodes, ["x"], ["y"])


def _parts(units: Sequence[Unit], ep: str) -> list[set[str]]:
    return [set(_node_names(u)) for u in units if u.ep.name == ep]


def _run(model: bytes, eps: Sequence[type[FusingEP]], inputs: Sequence[str] = ("x",)) -> list[set[str]]:
    """The partitions of the last EP in a session, after checking its outputs against onnxruntime."""
    feeds = _feeds(list(inputs))
    with registered(*eps):
        sess = _session(model, [ep.name for ep in eps], **{"epctx.partition.cost_rule": "0"})
        _assert_close(sess.run(None, feeds), run_ort(model, feeds), "groups")
    return [set(names) for ep, names in sess.get_partitions() if ep == eps[-1].name]


def test_two_groups_of_one_ep_stay_two_partitions() -> None:
    model = _chain(4)
    grouped = _grouping_ep("TestGroupsEP", [{"n0", "n1"}, {"n2", "n3"}])
    assert _run(model, [grouped]) == [{"n0", "n1"}, {"n2", "n3"}]
    assert grouped.calls == [2]  # both partitions compiled in one call
    # the same nodes claimed flat: the framework makes one partition of them
    flat = _grouping_ep("TestFlatEP", [], claimed={"n0", "n1", "n2", "n3"})
    assert _run(model, [flat]) == [{"n0", "n1", "n2", "n3"}]


def test_flat_claims_are_never_merged_into_a_group() -> None:
    ep = _grouping_ep("TestMixedEP", [{"n0", "n1"}], claimed={"n2", "n3"})
    assert _run(_chain(4), [ep]) == [{"n0", "n1"}, {"n2", "n3"}]


def test_a_group_split_by_an_earlier_ep_becomes_its_cycle_free_parts() -> None:
    earlier = make_fusing_ep(_by_name({"n2"}), "TestEarlierEP")
    grouped = _grouping_ep("TestLaterEP", [{"n0", "n1", "n2", "n3", "n4"}])
    assert _run(_chain(5), [earlier, grouped]) == [{"n0", "n1"}, {"n3", "n4"}]
    # the later EP was told which nodes the earlier one took
    assert [{n.name for n in ctx.assigned} for ctx in grouped.contexts] == [{"n2"}]  # type: ignore[attr-defined]


def _diamond() -> bytes:
    """a -> b -> d and a -> c -> d."""
    nodes = [
        helper.make_node("Relu", ["x"], ["ta"], name="a"),
        helper.make_node("Neg", ["ta"], ["tb"], name="b"),
        helper.make_node("Abs", ["ta"], ["tc"], name="c"),
        helper.make_node("Add", ["tb", "tc"], ["y"], name="d"),
    ]
    return _model(nodes, ["x"], ["y"])


def test_a_group_a_path_leaves_and_reenters_is_split_into_cycle_free_parts() -> None:
    # {a, c, d} with b on the CPU EP: a -> b -> d leaves the group and comes back; the parts are {a, c} and
    # {d} or {a} and {c, d}, never a and d together
    ep = _grouping_ep("TestCyclicEP", [{"a", "c", "d"}])
    parts = _run(_diamond(), [ep])
    assert (
        len(parts) == 2 and not any({"a", "d"} <= p for p in parts) and set().union(*parts) == {"a", "c", "d"}
    )


def _crossed() -> bytes:
    """Two independent pairs crossing: a1 -> b1 and b2 -> a2 (groups {a1, a2} and {b1, b2} would need each
    other's output first)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["ta1"], name="a1"),
        helper.make_node("Neg", ["ta1"], ["y1"], name="b1"),
        helper.make_node("Abs", ["x"], ["tb2"], name="b2"),
        helper.make_node("Neg", ["tb2"], ["y2"], name="a2"),
    ]
    return _model(nodes, ["x"], ["y1", "y2"])


def test_two_groups_that_need_each_other_split_the_later_one() -> None:
    ep = _grouping_ep("TestCrossedEP", [{"a1", "a2"}, {"b1", "b2"}])
    assert _run(_crossed(), [ep]) == [{"b2"}, {"a1", "a2"}, {"b1"}]  # in execution order


def test_a_group_closing_a_cycle_through_an_earlier_eps_partition_is_split(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """g1 -> p1 and p2 -> g2, p1 and p2 fused by the earlier EP: {g1, g2} has no path out and back on the nodes,
    but through the partition {p1, p2} it has (``CapabilityContext.assigned_partitions`` shows it)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["t1"], name="g1"),
        helper.make_node("Neg", ["t1"], ["y1"], name="p1"),
        helper.make_node("Abs", ["x"], ["t2"], name="p2"),
        helper.make_node("Neg", ["t2"], ["y2"], name="g2"),
    ]
    model = _model(nodes, ["x"], ["y1", "y2"])
    earlier = make_fusing_ep(_by_name({"p1", "p2"}), "TestFirstEP")
    grouped = _grouping_ep("TestSecondEP", [{"g1", "g2"}])
    with caplog.at_level(logging.INFO, logger="epctx"):
        assert _run(model, [earlier, grouped]) == [{"g1"}, {"g2"}]
    assert [{n.name for n in p.nodes} for p in earlier.compiled] == [{"p1", "p2"}]
    assert "TestSecondEP: group 0 of 2 node(s) split into 2 cycle-free partitions" in caplog.text
    (ctx,) = grouped.contexts  # type: ignore[attr-defined]
    assert [{n.name for n in p} for p in ctx.assigned_partitions] == [{"p1", "p2"}]

    # An EP that forms its groups with fused_groups and the partitions ahead gets them as they are.
    base = make_fusing_ep(_by_name(()), "TestAwareEP")

    def get_capability(self: Any, graph: ir.Graph, opset_imports: Any, ctx: CapabilityContext) -> Capability:
        mine = [n for n in graph if n.name in ("g1", "g2")]
        return Capability(groups=tuple(map(tuple, fused_groups(graph, mine, ctx.assigned_partitions))))

    aware = type("AwareEP", (base,), {"get_capability": get_capability})
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="epctx"):
        assert _run(model, [earlier, aware]) == [{"g1"}, {"g2"}]
    assert "split into" not in caplog.text


def _partition_with(ep: type[FusingEP], model: bytes) -> list[Unit]:
    ir_model = load_model(model).model
    return GraphPartitioner([ep(), CPUExecutionProvider()], cpu_fallback=True).partition(
        ir_model.graph, dict(ir_model.opset_imports)
    )


@pytest.mark.parametrize(
    ("groups", "claimed", "message"),
    [
        ([["n0", "n0"]], (), "claims node 'n0' (Relu) twice: in group 0 and in group 0"),
        ([["n0", "n1"], ["n1", "n2"]], (), "claims node 'n1' (Neg) twice: in group 0 and in group 1"),
        ([["n1"]], ("n1",), "claims node 'n1' (Neg) twice: in group 0 and in claimed"),
    ],
)
def test_a_node_claimed_twice_is_ep_fail_naming_the_ep(
    groups: Groups, claimed: Sequence[str], message: str
) -> None:
    base = make_fusing_ep(_by_name(()), "TestTwiceEP")

    def get_capability(self: Any, graph: ir.Graph, opset_imports: Any, ctx: CapabilityContext) -> Capability:
        by_name = {node.name: node for node in graph}
        return Capability(
            tuple(by_name[x] for x in claimed), groups=tuple(tuple(by_name[x] for x in g) for g in groups)
        )

    ep = type("TwiceEP", (base,), {"get_capability": get_capability})
    with pytest.raises(EPFail, match="^" + re.escape(f"[EP_FAIL] TestTwiceEP.get_capability {message}")):
        _partition_with(ep, _chain(3))


def test_a_node_of_another_graph_is_ep_fail_naming_the_ep() -> None:
    elsewhere = load_model(_chain(2)).model.graph
    base = make_fusing_ep(_by_name(()), "TestStrayEP")

    def get_capability(self: Any, graph: ir.Graph, opset_imports: Any, ctx: CapabilityContext) -> Capability:
        return Capability(groups=((next(iter(graph)), next(iter(elsewhere))),))

    ep = type("StrayEP", (base,), {"get_capability": get_capability})
    with pytest.raises(
        EPFail,
        match=r"^\[EP_FAIL\] TestStrayEP\.get_capability claims node 'n0' \(Relu\) in group 0, which is not",
    ):
        _partition_with(ep, _chain(3))
    with registered(ep), pytest.raises(epctx.EPFail, match="TestStrayEP"):
        _session(_chain(3), [ep.name])

    def flat_capability(self: Any, graph: ir.Graph, opset_imports: Any, ctx: CapabilityContext) -> Capability:
        return Capability((*graph, next(iter(elsewhere))))

    flat = type("StrayFlatEP", (base,), {"get_capability": flat_capability})
    with pytest.raises(
        EPFail, match=r"claims node 'n0' \(Relu\) in claimed, which is not a node of the graph"
    ):
        _partition_with(flat, _chain(3))


def test_a_flat_claim_may_list_a_node_twice() -> None:
    base = make_fusing_ep(_by_name(()), "TestRepeatEP")

    def get_capability(self: Any, graph: ir.Graph, opset_imports: Any, ctx: CapabilityContext) -> Capability:
        return Capability((*graph, *graph))  # the first contract allowed it: taken once

    units = _partition_with(type("RepeatEP", (base,), {"get_capability": get_capability}), _chain(3))
    assert [_node_names(u) for u in units] == [["n0", "n1", "n2"]]


def test_a_kernel_ep_runs_its_groups_node_by_node() -> None:
    class GroupingCPU(CPUExecutionProvider):
        def get_capability(self, graph: ir.Graph, opset_imports: Any, ctx: CapabilityContext) -> Capability:
            return Capability(groups=(tuple(graph),))

    ir_model = load_model(_chain(3)).model
    units = GraphPartitioner([GroupingCPU()], cpu_fallback=False).partition(
        ir_model.graph, dict(ir_model.opset_imports)
    )
    assert [_node_names(u) for u in units] == [["n0"], ["n1"], ["n2"]] and all(
        u.partition is None for u in units
    )


@st.composite
def _grouped_case(draw: st.DrawFn) -> tuple[bytes, list[tuple[str, frozenset[str]]], list[list[set[str]]]]:
    """A random DAG and claims (tests.test_partitioner), each EP's claim cut into random groups."""
    model, _, claims = draw(_random_case())
    groupings = []
    for _, owned in claims:
        labels = {name: draw(st.integers(0, 3)) for name in sorted(owned)}
        groupings.append([{n for n, k in labels.items() if k == g} for g in range(4) if g in labels.values()])
    return model, claims, groupings


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(case=_grouped_case())
def test_random_groups_partition_soundly(
    case: tuple[bytes, list[tuple[str, frozenset[str]]], list[list[set[str]]]],
) -> None:
    model, claims, groupings = case
    eps = [_grouping_ep(name, groups) for (name, _), groups in zip(claims, groupings)]
    ir_model = load_model(model).model
    units = GraphPartitioner(
        [ep() for ep in eps] + [CPUExecutionProvider()], cpu_fallback=True, cost_rule=False
    ).partition(ir_model.graph, dict(ir_model.opset_imports))
    dag = _Dag(model)
    _check_structure(dag, units, claims)
    for (name, _), groups in zip(claims, groupings):
        for part in _parts(units, name):  # never two groups in one partition
            assert any(part <= group for group in groups), (name, part, groups)
    first = groupings[0][0] if groupings[0] else set()
    if first and _convex(dag, first):  # nothing taken yet and no path out and back in: it stays whole
        assert first in _parts(units, claims[0][0]), (first, _parts(units, claims[0][0]))


def _convex(dag: _Dag, members: set[str]) -> bool:
    stack = [s for m in members for s in dag.succ[m] if s not in members]
    reached: set[str] = set()
    while stack:
        node = stack.pop()
        if node in members:
            return False
        if node not in reached:
            reached.add(node)
            stack.extend(dag.succ[node])
    return True
