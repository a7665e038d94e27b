"""IREE's capability search with its probe records (``providers/iree/probe_cache.py``), its time budget and
IREE's message naming nodes (``blame.py``), IREE's compiles stood in for by a rule and a clock that the
stand-in advances by the seconds each compile "takes" (the real compiles: ``test_iree_probe_cache_real.py``).
What is kept in one search is what the next one reads: it compiles no node set whose outcome it knows, and
reaches the same verdict; then it compiles the code of the groups that passed (no code is kept)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from epctx.ep import CompileGuard, Partition
from epctx.providers.iree import probing, search
from epctx.providers.iree.blame import named_nodes
from epctx.providers.iree.compile import CompileResult
from epctx.providers.iree.probe_cache import probe_key

EP = "IREEExecutionProvider"
LAYOUT = "--channels-last"
CODEGEN = "error: failed to run translation of source executable to target executable for backend"


def _chain(n: int) -> ir.Graph:
    values = ["x", *[f"v{k}" for k in range(n - 1)], "y"]
    nodes = [helper.make_node("Relu", [values[k]], [values[k + 1]], name=f"r{k}") for k in range(n)]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    return ir.serde.deserialize_model(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ).graph


class FakeIREE:
    """Stands in for ``compile_partitions``: ``fails(names, probe, flags)`` -> IREE's message or None; each
    compile takes ``seconds_per_node`` per node on the clock (a call's compiles in parallel: its longest)."""

    def __init__(
        self, fails: Callable[[set[str], bool, Sequence[str]], str | None], seconds_per_node: float = 0.0
    ):
        self.fails = fails
        self.seconds_per_node = seconds_per_node
        self.now = 0.0
        self.compiled: list[tuple[frozenset[str], bool]] = []  # (node set, probe)
        self.calls: list[tuple[float, float]] = []  # (start, end) on the clock

    def __call__(
        self, partitions: Sequence[Partition], flags: Sequence[str], guard: CompileGuard, **_: object
    ) -> list[CompileResult]:
        guard.check(EP, len(partitions), "for its capability check")
        results = []
        probe = probing.PROBE_FLAG in flags
        for p in partitions:
            names = {n.name or "" for n in p.nodes}
            self.compiled.append((frozenset(names), probe))
            error = self.fails(names, probe, flags)
            seconds = self.seconds_per_node * len(names)
            results.append(CompileResult(error is None, stage="compile" if error else "", error=error or "",
                                         seconds=seconds))  # fmt: skip
        start = self.now
        self.now += max((r.seconds for r in results), default=0.0)
        if partitions:
            self.calls.append((start, self.now))
        return results


def _search(
    monkeypatch: pytest.MonkeyPatch, graph: ir.Graph, fake: FakeIREE, *, budget_s: float = 30,
    flags: Sequence[str] = (),
) -> probing.Verdict:  # fmt: skip
    monkeypatch.setattr(search, "compile_partitions", fake)
    monkeypatch.setattr(search, "_clock", lambda: fake.now)
    fake.compiled.clear()
    fake.calls.clear()
    return probing.check_nodes(EP, graph, {"": 17}, list(graph), flags, CompileGuard(), layout_flag=LAYOUT,
                               budget_s=budget_s)  # fmt: skip


def _outcome(verdict: probing.Verdict) -> tuple[list[list[str]], dict[str, str]]:
    return [[n.name or "" for n in g] for g in verdict.groups], {
        n.name or "": w for n, w in verdict.declined.items()
    }


def _r5_fails(names: set[str], probe: bool, flags: Sequence[str]) -> str | None:
    return "error: 'onnx.Relu' op r5 is not supported" if "r5" in names else None


def test_a_second_search_compiles_only_the_groups_code_and_decides_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    graph = _chain(8)
    fake = FakeIREE(_r5_fails)
    first = _outcome(_search(monkeypatch, graph, fake))
    assert first[0] == [["r0", "r1", "r2", "r3", "r4"], ["r6", "r7"]] and list(first[1]) == ["r5"]
    failed_or_probed = [c for c in fake.compiled if c[1] or "r5" in c[0]]
    assert len(failed_or_probed) > 3  # the whole set, then the probes of the bisection
    second = _outcome(_search(monkeypatch, _chain(8), fake))  # the same model, loaded again
    assert second == first
    # no probe, no failed set: the code of the two groups, whose code the session needs, in one call
    assert sorted(fake.compiled, key=lambda c: len(c[0])) == [
        (frozenset({"r6", "r7"}), False),
        (frozenset({"r0", "r1", "r2", "r3", "r4"}), False),
    ]
    assert len(fake.calls) == 1


def test_corrupt_records_are_ignored_and_written_again(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeIREE(_r5_fails)
    first = _outcome(_search(monkeypatch, _chain(8), fake))
    count = len(fake.compiled)
    records = sorted(Path(_cache_dir()).rglob("*.json"))
    assert len(records) > 3
    for k, path in enumerate(records):
        path.write_bytes(path.read_bytes()[: k % 7])  # truncated, some empty
    assert _outcome(_search(monkeypatch, _chain(8), fake)) == first
    assert len(fake.compiled) == count  # everything compiled again
    assert _outcome(_search(monkeypatch, _chain(8), fake)) == first
    assert len(fake.compiled) == 2  # and kept again: only the groups' code


def _cache_dir() -> str:
    import os

    return os.environ["EPCTX_CACHE_DIR"]


def test_the_records_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPCTX_IREE_PROBE_CACHE", "0")
    fake = FakeIREE(_r5_fails)
    _search(monkeypatch, _chain(8), fake)
    count = len(fake.compiled)
    _search(monkeypatch, _chain(8), fake)
    assert len(fake.compiled) == count and not list(Path(_cache_dir()).rglob("*.json"))


def test_the_budget_bounds_each_search_and_the_next_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each compile takes 1 s a node; the budget is 12 s. The first compile (the whole set, 16 s) runs whatever
    the budget, and nothing after it: every node goes to the next EP, a warning says why and what to do. Each
    later search reads what the earlier ones kept and goes on (its first compile whatever its expected time, the
    others only when expected to end within the budget), until the verdict is the one an unbounded search
    reaches; from then on the same, compiling only the groups' code (outside the budget)."""
    unbounded = _outcome(_search(monkeypatch, _chain(16), FakeIREE(_r13_fails), budget_s=1e9))
    monkeypatch.setenv("EPCTX_CACHE_DIR", _cache_dir() + "-bounded")
    fake = FakeIREE(_r13_fails, seconds_per_node=1.0)
    caplog.set_level("INFO", logger="epctx")
    verdict = _search(monkeypatch, _chain(16), fake, budget_s=12)
    assert fake.now == 16 and len(fake.compiled) == 1 and not verdict.groups
    assert all("capability budget of 12 s was spent" in why for why in verdict.declined.values())
    # it says why it stopped before its budget's end: the next step (the halves' probes, 16 nodes at 1 s a node)
    assert "ran out after 16.0 s (its next step, expected to take 16 s more" in caplog.text
    assert "with 16 node(s) undecided" in caplog.text
    assert "raise the provider option capability_budget_s" in caplog.text
    outcomes = []
    for _ in range(8):
        fake.now = 0.0
        outcomes.append(_outcome(_search(monkeypatch, _chain(16), fake, budget_s=12)))
        assert all(end <= 12 for _, end in fake.calls[1:])  # past the first, none expected to end later
        if outcomes[-1] == unbounded:
            break
    assert outcomes[-1] == unbounded and len(outcomes) > 1
    fake.now = 0.0
    assert _outcome(_search(monkeypatch, _chain(16), fake, budget_s=12)) == unbounded  # and stays so
    assert {names for names, _ in fake.compiled} == {frozenset(g) for g in unbounded[0]}


def _r13_fails(names: set[str], probe: bool, flags: Sequence[str]) -> str | None:
    return "error: r13 is not supported" if "r13" in names else None


def _relu_op(k: int) -> str:
    return f'    %{k} = torch.operator "onnx.Relu"(%{k - 1}) : (!torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32> '


def test_nodes_iree_names_are_left_out_and_the_rest_compiled_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A code generation failure whose message quotes an operation: the nodes it may be are declined with
    IREE's message, the others compiled together (one compile per group), with no bisection."""
    graph = _chain(6)
    graph.node(2).inputs[0].shape = ir.Shape([2])  # r2's operand and result are known to be [2], r4's [3]
    graph.node(2).outputs[0].shape = ir.Shape([2])
    graph.node(4).inputs[0].shape = ir.Shape([3])

    def fails(names: set[str], probe: bool, flags: Sequence[str]) -> str | None:
        if "r2" in names and not probe:
            return f"module.mlir:7:5: error: 'iree_codegen.x' op failed\n{_relu_op(7)}\n{CODEGEN} llvm-cpu"
        return None

    fake = FakeIREE(fails)
    verdict = _search(monkeypatch, graph, fake, flags=[LAYOUT])
    groups, declined = _outcome(verdict)
    # r4 is a Relu too, but its operand is [3]: not the operation quoted. The others' shapes are unknown: they
    # may be it (leaving them out costs a node each; keeping one IREE fails on costs the whole compile)
    assert "r2" in declined and "r4" not in declined
    assert "IREE's message names this node" in declined["r2"] and "iree_codegen.x" in declined["r2"]
    assert not any(
        probe for _, probe in fake.compiled
    )  # no flow probes: they pass what code generation fails
    assert all(LAYOUT in f for f in [verdict.probes.flags])  # a code generation failure: no layout retry
    assert len(fake.compiled) == 1 + len(groups)


def test_named_nodes_reads_iree_messages() -> None:
    graph = _chain(3)
    graph.node(1).inputs[0].shape = ir.Shape([2])
    message = "\n".join([f"module.mlir:3:1: error: no\n{_relu_op(3)}", "not an operation line"])
    # %2: an operand a node of the group gives (r0 reads the graph's input: %arg0); r1's operand is [2]
    assert [n.name for n in named_nodes(message, list(graph))] == ["r1", "r2"]
    graph.node(1).inputs[0].shape = ir.Shape([5])
    assert [n.name for n in named_nodes(message, list(graph))] == ["r2"]  # r1's operand: [5]
    graph.node(1).inputs[0].shape = None
    from_outside = message.replace("(%2)", "(%arg0)")
    assert [n.name for n in named_nodes(from_outside, list(graph))] == ["r0"]
    assert [n.name for n in named_nodes(from_outside, list(graph)[1:])] == ["r1"]  # r0 is not in this group
    assert named_nodes("error: something without an operation", list(graph)) == []
    conv = 'torch.operator "onnx.Conv"(%1, %2) : (!torch.vtensor<[?,4],f32>, !torch.vtensor<[4,4],f32>) -> !x'
    assert named_nodes(conv, list(graph)) == []


def test_named_nodes_tells_a_split_result_and_attributes_apart() -> None:
    """nudenet: IREE quoted one Conv (``%24 = torch.operator "onnx.Conv"(%23#1, %6, %7)``: it reads the second
    result of a Split); by types alone all 17 of its 64x64x3x3 Convs agreed."""
    nodes = [
        helper.make_node("Split", ["x"], ["s0", "s1"], name="split", axis=0),
        helper.make_node("MaxPool", ["s0"], ["p0"], name="pool0", kernel_shape=[3]),
        helper.make_node("MaxPool", ["s1"], ["p1"], name="pool1", kernel_shape=[3]),
        helper.make_node("MaxPool", ["s1"], ["p2"], name="pool2", kernel_shape=[5]),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("p0", "p1", "p2")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 1, 8])], outputs
    )
    group = list(ir.serde.deserialize_model(helper.make_model(graph)).graph)
    line = (
        '%9 = torch.operator "onnx.MaxPool"(%8#1) {torch.onnx.kernel_shape = [3 : si64]} : '
        "(!torch.vtensor<[?,1,8],f32>) -> !torch.vtensor<[?,1,6],f32>"
    )
    assert [n.name for n in named_nodes(line, group)] == ["pool1"]  # not pool0 (result #0), not pool2 (5)
    assert [n.name for n in named_nodes(line.replace("%8#1", "%8#0"), group)] == ["pool0"]


def test_probe_keys_follow_what_decides_the_outcome() -> None:
    from epctx.ep import make_partition

    def key(graph: ir.Graph, flags: Sequence[str] = ("--a",), name: str = "p") -> str:
        return probe_key(make_partition(name, EP, graph, list(graph), {"": 17}), flags)

    graph = _chain(3)
    assert key(graph) == key(_chain(3)) == key(graph, name="another name")
    assert key(graph) != key(graph, ("--b",)) and key(graph) != key(graph, ("--a", "--b"))
    assert key(graph) != key(_chain(4))
    changed = _chain(3)
    changed.node(1).op_type = "Sigmoid"
    assert key(changed) != key(graph)


def _side_branch() -> ir.Graph:
    """a -> b -> c -> d, and s (a graph output) reading b: in graph order a, b, s, c, d."""
    nodes = [
        helper.make_node("Relu", ["x"], ["v1"], name="a"),
        helper.make_node("Relu", ["v1"], ["v2"], name="b"),
        helper.make_node("Sigmoid", ["v2"], ["z"], name="s"),
        helper.make_node("Relu", ["v2"], ["v3"], name="c"),
        helper.make_node("Relu", ["v3"], ["y"], name="d"),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("y", "z")]
    graph = helper.make_graph(
        nodes, "side", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])], outputs
    )
    return ir.serde.deserialize_model(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ).graph


@pytest.mark.parametrize("together", [True, False])
def test_neighbouring_pieces_are_tried_as_one_partition(
    monkeypatch: pytest.MonkeyPatch, together: bool
) -> None:
    """s fails in code generation: halving leaves {a, b} and {c, d} apart, though one partition holds them (s is a
    side branch). They are compiled as one (one compile): kept so when it passes, apart when it fails."""

    def fails(names: set[str], probe: bool, flags: Sequence[str]) -> str | None:
        if not probe and ("s" in names or (not together and {"b", "c"} <= names)):
            return f"error: no\n{CODEGEN} llvm-cpu"
        return None

    fake = FakeIREE(fails)
    groups, declined = _outcome(_search(monkeypatch, _side_branch(), fake))
    assert list(declined) == ["s"]
    assert groups == ([["a", "b", "c", "d"]] if together else [["a", "b"], ["c", "d"]])
    assert fake.compiled[-1] == (frozenset("abcd"), False)  # the merge, tried once, last
    assert len(fake.compiled) == len(set(fake.compiled)) == 6  # abscd, ab, scd, s, cd, abcd


def test_recorded_groups_get_their_code_with_the_flags_they_passed_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """r2 runs on another EP: {r0, r1} and {r3, r4} are checked apart. {r0, r1} passes channels-last; {r3, r4}
    fails with and without it, and the dims are dynamic: the search goes on in ONNX's layout. The next search
    reads both outcomes, and compiles {r0, r1}'s code with the flags it passed with."""
    graph = _chain(5)
    graph.inputs[0].shape = ir.Shape(["n"])

    flags_of: dict[frozenset[str], tuple[str, ...]] = {}

    def fails(names: set[str], probe: bool, flags: Sequence[str]) -> str | None:
        flags_of[frozenset(names)] = tuple(flags)
        return "error: no" if "r4" in names else None

    fake = FakeIREE(fails)
    for _ in range(2):
        monkeypatch.setattr(search, "compile_partitions", fake)
        fake.compiled.clear()
        verdict = probing.check_nodes(EP, graph, {"": 17}, [n for n in graph if n.name != "r2"], [LAYOUT],
                                      CompileGuard(), layout_flag=LAYOUT)  # fmt: skip
        assert _outcome(verdict)[0] == [["r0", "r1"], ["r3"]] and verdict.probes.flags == ()
        assert {frozenset(n.name for n in g) for g in verdict.probes.compiled} == {
            frozenset({"r0", "r1"}),
            frozenset({"r3"}),
        }
    assert sorted(fake.compiled, key=lambda c: len(c[0])) == [(frozenset({"r3"}), False),
                                                              (frozenset({"r0", "r1"}), False)]  # fmt: skip
    assert flags_of[frozenset({"r0", "r1"})] == (LAYOUT,) and flags_of[frozenset({"r3"})] == ()


def test_the_rewrite_version_covers_every_module_the_worker_imports() -> None:
    """A change to any module that makes IREE's input (the worker's rewrites) changes the records' version: a
    rewrite module left out of ``_REWRITE_MODULES`` would let records of the old rewrite answer for the new."""
    import ast

    from epctx.providers.iree import probe_cache

    here = Path(probe_cache.__file__).resolve().parent
    tree = ast.parse((here / "worker.py").read_text(encoding="utf-8"))
    imported = {
        node.module.rsplit(".", 1)[-1] + ".py"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("epctx.providers.iree.")
    }
    helpers = {"lifeline.py"}  # the worker's process lifetime, not its input
    assert imported - helpers <= set(probe_cache._REWRITE_MODULES), imported - set(
        probe_cache._REWRITE_MODULES
    )
