"""The IREE EP's capability check (``providers/iree/probing.py``) with IREE's compiles stood in for by a rule:
which node sets "compile" (with which flags). The real compiles are tested in ``test_iree_ep.py``; here: the
whole set first, the layout fallback, the bisection with cheap probes within a budget, and the check that the
partitions the partitioner will form from the claim compile, whatever IREE's reasons."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from epctx.ep import CompileGuard, Partition
from epctx.providers.iree import probing, search
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


LAYOUT = "--channels-last"


def _check(
    monkeypatch: pytest.MonkeyPatch,
    graph: ir.Graph,
    compiles: Callable[[set[str]], bool],
    *,
    flags: Sequence[str] = (),
    budget_s: float = 30,
    full_only: Callable[[set[str], Sequence[str]], bool] = lambda names, flags: True,
    skip: frozenset[str] = frozenset(),
    partitions: Sequence[Sequence[str]] = (),
) -> tuple[probing.Verdict, list[set[str]]]:
    """``compiles``: whether a node set passes; ``full_only``: what fails only in a full compile (not a probe),
    or with the flags given. ``asked``: the node sets of full compiles."""
    asked: list[set[str]] = []

    def fake(
        partitions: Sequence[Partition], flags: Sequence[str], guard: CompileGuard, **_: object
    ) -> list[CompileResult]:
        guard.check(EP, len(partitions), "for its capability check")
        results = []
        for p in partitions:
            names = {n.name or "" for n in p.nodes}
            probe = probing.PROBE_FLAG in flags
            if not probe:
                asked.append(names)
            ok = compiles(names) and (probe or full_only(names, flags))
            results.append(CompileResult(ok, stage="" if ok else "compile", error="" if ok else "error: no"))
        return results

    monkeypatch.setattr(search, "compile_partitions", fake)
    # each check here stands IREE in by its own rule: none reads what another kept (test_iree_probe_cache.py)
    monkeypatch.setenv("EPCTX_IREE_PROBE_CACHE", "0")
    verdict = probing.check_nodes(
        EP,
        graph,
        {"": 17},
        [n for n in graph if n.name not in skip],
        flags,
        CompileGuard(),
        layout_flag=LAYOUT,
        budget_s=budget_s,
        partitions=[[n for n in graph if n.name in names] for names in partitions],
    )
    return verdict, asked


def test_a_node_iree_cannot_compile_is_declined_and_the_rest_checked_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    verdict, asked = _check(monkeypatch, _relu_chain(4), lambda names: "r2" not in names)
    assert [n.name for n in verdict.claimed] == ["r0", "r1", "r3"]
    assert {n.name for n in verdict.declined} == {"r2"}
    # r2 runs on the next EP between them: the partitioner forms {r0, r1} and {r3}; those are compiled, not the
    # claimed set as one (which is not a partition anyone will ask for)
    assert asked[1:] == [{"r0", "r1"}, {"r3"}]
    assert {frozenset(n.name for n in k) for k in verdict.probes.compiled} == {
        frozenset({"r0", "r1"}),
        frozenset({"r3"}),
    }
    assert _names(verdict.groups) == [["r0", "r1"], ["r3"]]  # what IREE returns: the groups compiled


def test_groups_that_compile_apart_but_not_together_are_kept_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    # IREE fails on r1 and r2 in one module, compiles each alone: the whole set fails, both halves compile
    # (probes and full compiles): two groups, nothing declined, the whole set compiled once.
    verdict, asked = _check(monkeypatch, _relu_chain(4), lambda names: not {"r1", "r2"} <= names)
    assert [n.name for n in verdict.claimed] == ["r0", "r1", "r2", "r3"] and not verdict.declined
    assert _names(verdict.groups) == [["r0", "r1"], ["r2", "r3"]] and _all_compiled(verdict)
    assert _sets(asked) == _sets([{"r0", "r1", "r2", "r3"}, {"r0", "r1"}, {"r2", "r3"}])


def test_a_codegen_failure_declines_its_region_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # r3 passes the cheap probes and fails in code generation: the group {r2, r3} the probes passed fails its
    # full compile and is bisected with full compiles; r2 stays on IREE, r3 alone is declined.
    verdict, asked = _check(
        monkeypatch,
        _relu_chain(4),
        lambda names: "r1" not in names,
        full_only=lambda names, flags: "r3" not in names,
    )
    assert [n.name for n in verdict.claimed] == ["r0", "r2"]
    assert {n.name for n in verdict.declined} == {"r1", "r3"}
    assert verdict.declined[_node(verdict, "r3")].startswith("IREE compile failed: error: no")
    assert _names(verdict.groups) == [["r0"], ["r2"]] and _all_compiled(verdict)
    assert len(asked) == len(_sets(asked))  # no node set compiled twice


def test_no_set_is_compiled_twice_and_failures_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only single nodes compile fully (a codegen failure in every larger piece): the whole set, each half and
    # each quarter are compiled once each, the whole set's failure reused when the claim is grouped.
    verdict, asked = _check(
        monkeypatch, _relu_chain(8), lambda names: True, full_only=lambda n, f: len(n) == 1
    )
    assert len(asked) == len(_sets(asked)) == 1 + 2 + 4 + 8
    assert not verdict.declined and len(verdict.groups) == 8 and _all_compiled(verdict)


def _node(verdict: probing.Verdict, name: str) -> ir.Node:
    return next(n for n in verdict.declined if n.name == name)


def _sets(asked: Sequence[set[str]]) -> set[frozenset[str]]:
    return {frozenset(names) for names in asked}


def _names(groups: Sequence[Sequence[ir.Node]]) -> list[list[str]]:
    return [[n.name or "" for n in g] for g in groups]


def _all_compiled(verdict: probing.Verdict) -> bool:
    """The groups cover the claim, each node once, and each group is a compile that passed."""
    flat = [n for g in verdict.groups for n in g]
    return sorted(flat, key=verdict.claimed.index) == verdict.claimed and all(
        frozenset(g) in verdict.probes.compiled and verdict.probes.compiled[frozenset(g)][1].ok
        for g in verdict.groups
    )


def test_channels_last_dropped_when_only_it_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    verdict, asked = _check(
        monkeypatch,
        _relu_chain(3),
        lambda names: True,
        flags=[LAYOUT],
        full_only=lambda n, f: LAYOUT not in f,
    )
    assert [n.name for n in verdict.claimed] == ["r0", "r1", "r2"] and not verdict.declined
    assert verdict.probes.flags == () and len(asked) == 2  # the whole set, with and without the layout flag


def test_the_budget_bounds_the_bisection(monkeypatch: pytest.MonkeyPatch) -> None:
    verdict, _ = _check(monkeypatch, _relu_chain(8), lambda names: "r5" not in names, budget_s=0)
    assert not verdict.claimed and not verdict.groups
    assert all("capability budget of 0 s was spent" in why for why in verdict.declined.values())
    assert len(verdict.declined) == 8


def test_a_set_that_compiles_whole_is_compiled_once(monkeypatch: pytest.MonkeyPatch) -> None:
    verdict, asked = _check(monkeypatch, _relu_chain(3), lambda names: True)
    assert (
        len(asked) == 1 and [n.name for n in verdict.claimed] == ["r0", "r1", "r2"] and not verdict.declined
    )
    assert frozenset(verdict.claimed) in verdict.probes.compiled
    assert _names(verdict.groups) == [["r0", "r1", "r2"]] and _all_compiled(verdict)


def test_a_set_that_compiles_whole_but_is_split_is_checked_as_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """r1 is no candidate (another EP runs it): the set {r0, r2, r3} compiles as one, but the partitioner forms
    {r0} and {r2, r3}; those are what is compiled, and only those: the set as one is no partition anyone will ask
    for (rapidocr's recognizer failed so: checked as one set, split when compiled)."""
    verdict, asked = _check(monkeypatch, _relu_chain(4), lambda names: True, skip=frozenset({"r1"}))
    assert [n.name for n in verdict.claimed] == ["r0", "r2", "r3"] and not verdict.declined
    assert sorted(asked, key=len) == [{"r0"}, {"r2", "r3"}]
    assert _names(verdict.groups) == [["r0"], ["r2", "r3"]] and _all_compiled(verdict)


def test_nodes_an_earlier_ep_took_are_neither_offered_nor_declined() -> None:
    from epctx.providers.iree.capability import candidate_nodes

    graph = _relu_chain(3)
    taken = frozenset(n for n in graph if n.name == "r1")
    found, declined = candidate_nodes(graph, frozenset(), taken)
    # (the chain's inner values have no declared type: IREE declines r0 and r2 for that, never r1)
    assert not found and sorted(n.name or "" for n in declined) == ["r0", "r2"]
    found, declined = candidate_nodes(graph, frozenset())
    assert sorted(n.name or "" for n in declined) == ["r0", "r1", "r2"]


def _crossed() -> ir.Graph:
    """g1 -> p1 and p2 -> g2 (p1 and p2 independent)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["t1"], name="g1"),
        helper.make_node("Relu", ["t1"], ["y1"], name="p1"),
        helper.make_node("Relu", ["x"], ["t2"], name="p2"),
        helper.make_node("Relu", ["t2"], ["y2"], name="g2"),
    ]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes,
        "crossed",
        [value("x", TensorProto.FLOAT, [2])],
        [value("y1", TensorProto.FLOAT, [2]), value("y2", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ir.serde.deserialize_model(model).graph


def test_groups_form_around_the_partitions_of_the_eps_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    skip = frozenset({"p1", "p2"})  # taken by an EP ahead
    alone, _ = _check(monkeypatch, _crossed(), lambda names: True, skip=skip)
    assert _names(alone.groups) == [["g1", "g2"]]  # no path out and back on the nodes
    # ... but the EP ahead fused p1 and p2 into one partition: through it, g1 reaches g2 and g2 needs it
    verdict, asked = _check(monkeypatch, _crossed(), lambda names: True, skip=skip, partitions=[["p1", "p2"]])
    assert _names(verdict.groups) == [["g1"], ["g2"]] and _all_compiled(verdict)
    assert sorted(asked, key=min) == [{"g1"}, {"g2"}]


def _with_shapeless_value(shapeless: str = "b") -> ir.Graph:
    """x -> r0 -> a -> r1 -> b -> r2 -> y, where ``shapeless`` has a type and no shape, the other a shape (onnx's
    inference leaves such values in real models: PP-OCR's recognizer)."""
    value = helper.make_tensor_value_info
    nodes = [helper.make_node("Relu", [i], [o], name=f"r{k}") for k, (i, o) in enumerate(["xa", "ab", "by"])]
    graph = helper.make_graph(
        nodes,
        "shapeless",
        [value("x", TensorProto.FLOAT, [2])],
        [value("y", TensorProto.FLOAT, [2])],
        value_info=[value(v, TensorProto.FLOAT, None if v == shapeless else [2]) for v in "ab"],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ir.serde.deserialize_model(model).graph


def test_a_boundary_value_without_a_shape_is_not_given_to_iree(monkeypatch: pytest.MonkeyPatch) -> None:
    # r1 runs on another EP: b enters r2's partition with no rank, which IREE would import as a scalar
    verdict, asked = _check(monkeypatch, _with_shapeless_value(), lambda names: True, skip=frozenset({"r1"}))
    assert _names(verdict.groups) == [["r0"]] and _all_compiled(verdict)
    why = verdict.declined[_node(verdict, "r2")]
    assert "value 'b' crosses the partition boundary with a type but no shape" in why and "scalar" in why
    assert asked == [{"r0"}]  # the sets holding r2 fail without a compile
    # inside a partition, the same value is no boundary: the three nodes compile whole
    whole, asked = _check(monkeypatch, _with_shapeless_value(), lambda names: True)
    assert _names(whole.groups) == [["r0", "r1", "r2"]] and asked == [{"r0", "r1", "r2"}]


def test_the_worker_refuses_a_boundary_without_a_shape(tmp_path: Path) -> None:
    from epctx.providers.iree import worker

    value = helper.make_tensor_value_info
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node], "g", [value("x", TensorProto.FLOAT, None)], [value("y", TensorProto.FLOAT, None)]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (tmp_path / "model.onnx").write_bytes(model.SerializeToString())
    (tmp_path / "job.json").write_text(json.dumps({"flags": [], "min_opset": 17}))
    assert worker.main([str(tmp_path)]) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert not result["ok"] and result["stage"] == "import"
    assert "value 'x' crosses the partition boundary with a type but no shape" in result["error"]


def test_declines_name_the_dims_to_state(monkeypatch: pytest.MonkeyPatch) -> None:
    model = ir.serde.serialize_model(ir.Model(_relu_chain(4), ir_version=8))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    graph = ir.serde.deserialize_model(model).graph
    verdict, _ = _check(monkeypatch, graph, lambda names: "r2" not in names)
    assert {n.name for n in verdict.declined} == {"r2"}
    why = verdict.declined[_node(verdict, "r2")]
    assert why.startswith("IREE compile failed: error: no") and "--dim batch=" in why


def test_a_failing_group_is_cut_where_no_shapeless_value_crosses(monkeypatch: pytest.MonkeyPatch) -> None:
    # r0 -> a -> r1 -> b (no shape) -> r2, all IREE's; the three fail together in a full compile: the halves are
    # {r0} and {r1, r2} (the middle cut would put b at a boundary), each compiled once
    verdict, asked = _check(
        monkeypatch, _with_shapeless_value(), lambda names: True, full_only=lambda n, f: len(n) < 3
    )
    assert (
        not verdict.declined and _names(verdict.groups) == [["r0"], ["r1", "r2"]] and _all_compiled(verdict)
    )
    assert asked[0] == {"r0", "r1", "r2"} and sorted(asked[1:], key=len) == [{"r0"}, {"r1", "r2"}]


def _reshape_by_input() -> ir.Graph:
    """x -> r0 -> a; s -> n0 -> u -> n1 -> t (Neg: t = s); Reshape(a, t) -> r1 -> r2 -> z (graph order)."""
    value = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="r0"),
        helper.make_node("Neg", ["s"], ["u"], name="n0"),
        helper.make_node("Neg", ["u"], ["t"], name="n1"),
        helper.make_node("Reshape", ["a", "t"], ["b"], name="reshape"),
        helper.make_node("Relu", ["b"], ["y"], name="r1"),
        helper.make_node("Relu", ["y"], ["z"], name="r2"),
    ]
    graph = helper.make_graph(
        nodes,
        "reshape",
        [value("x", TensorProto.FLOAT, [2, 6]), value("s", TensorProto.INT64, [2])],
        [value("z", TensorProto.FLOAT, ["m", "n"])],
        value_info=[
            value("y", TensorProto.FLOAT, ["m", "n"]),
            value("a", TensorProto.FLOAT, [2, 6]),
            value("u", TensorProto.INT64, [2]),
            value("t", TensorProto.INT64, [2]),
            value("b", TensorProto.FLOAT, ["m", "n"]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ir.serde.deserialize_model(model).graph


def test_a_reshape_shape_from_outside_the_partition_is_not_given_to_iree(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # IREE takes -1 in a Reshape shape known only at run as a size (RESOURCE_EXHAUSTED at run): with n1 on
    # another EP, t would enter the Reshape's partition at run time; the Reshape is declined, without a compile
    verdict, asked = _check(monkeypatch, _reshape_by_input(), lambda names: True, skip=frozenset({"n1"}))
    assert {n.name for n in verdict.declined} == {"reshape"}
    why = verdict.declined[_node(verdict, "reshape")]
    assert "value 't', the shape operand of Reshape 'reshape', would enter the partition at run time" in why
    assert all("reshape" not in names for names in asked)
    # the whole graph fails its full compile: its middle cut would separate n1 from the Reshape (t would cross
    # it), the cut next to it is taken
    verdict, asked = _check(
        monkeypatch, _reshape_by_input(), lambda names: True, full_only=lambda n, f: len(n) < 6
    )
    assert not verdict.declined and _all_compiled(verdict)
    assert _names(verdict.groups) == [["r0", "n0"], ["n1", "reshape", "r1", "r2"]]


def test_the_worker_refuses_a_reshape_shape_from_outside(tmp_path: Path) -> None:
    from epctx.providers.iree import worker

    value = helper.make_tensor_value_info
    node = helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")
    inputs = [value("x", TensorProto.FLOAT, [2, 6]), value("s", TensorProto.INT64, [2])]
    graph = helper.make_graph([node], "g", inputs, [value("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (tmp_path / "model.onnx").write_bytes(model.SerializeToString())
    (tmp_path / "job.json").write_text(json.dumps({"flags": [], "min_opset": 17}))
    assert worker.main([str(tmp_path)]) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert not result["ok"] and result["stage"] == "import"
    assert (
        "value 's', the shape operand of Reshape 'reshape', would enter the partition at run time"
        in result["error"]
    )


def _runtime_reshape(batch: str | int) -> ir.Graph:
    """x[batch, 6] -> Shape -> s; Reshape(x, s) ("dynamic"); Reshape(x, [-1]) ("constant")."""
    value = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Reshape", ["x", "s"], ["y"], name="dynamic"),
        helper.make_node("Reshape", ["x", "k"], ["z"], name="constant"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [value("x", TensorProto.FLOAT, [batch, 6])],
        [value("y", TensorProto.FLOAT, [batch, 6]), value("z", TensorProto.FLOAT, ["m"])],
        [helper.make_tensor("k", TensorProto.INT64, [1], [-1])],
        value_info=[value("s", TensorProto.INT64, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ir.serde.deserialize_model(model).graph


def test_a_reshape_to_a_runtime_shape_is_kept_out_of_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    # the model compiles whole: the Reshape to a shape computed at run stays in it
    verdict, _ = _check(monkeypatch, _runtime_reshape("n"), lambda names: True)
    assert _names(verdict.groups) == [["shape", "dynamic", "constant"]] and not verdict.declined
    # it does not (dims dynamic): the search for pieces leaves that Reshape out, with the reason
    verdict, _ = _check(
        monkeypatch, _runtime_reshape("n"), lambda names: True, full_only=lambda n, f: len(n) < 3
    )
    assert {n.name for n in verdict.declined} == {"dynamic"}
    assert "a Reshape to a shape computed at run" in verdict.declined[_node(verdict, "dynamic")]
    assert sorted(n.name or "" for n in verdict.claimed) == ["constant", "shape"] and _all_compiled(verdict)
    # with the size stated, IREE folds the shape: nothing is left out for it
    verdict, _ = _check(
        monkeypatch, _runtime_reshape(4), lambda names: True, full_only=lambda n, f: len(n) < 3
    )
    assert not verdict.declined and len(verdict.claimed) == 3
