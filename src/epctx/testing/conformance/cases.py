"""The conformance cases: each takes the suite and a record, and raises ``CaseFailed`` when a check fails."""

from __future__ import annotations

import shutil
from collections.abc import Callable

import numpy as np

from epctx.ep._compiling import NO_COMPILE_ENV
from epctx.ep._context_node import OP_TYPE
from epctx.epcontext.container import ContextBinary
from epctx.epcontext.merge import merge_context_models
from epctx.errors import ModelRequiresCompilation
from epctx.testing.conformance import models
from epctx.testing.conformance.context_files import (
    attr,
    counting_binary_opens,
    ctx_nodes,
    graph_of,
    rewrite_binary,
)
from epctx.testing.conformance.results import CaseFailed, Record, expect
from epctx.testing.conformance.suite import Suite

__all__ = ["CASE_BODIES"]


def _round_trip(suite: Suite, record: Record, embed: str) -> None:
    folder = suite.folder("model")
    made = suite.generate(record, folder, "model", models.chain(), ep__context_embed_mode=embed)
    feeds = models.feeds()
    expected = suite.oracle("chain0", models.chain(), feeds)
    suite.compare(record, [made.output], expected[:1], "generating session")
    nodes = ctx_nodes(made.ctx)
    expect(bool(nodes), f"{made.ctx.name} has no EPContext node")
    for node in nodes:
        expect(attr(node, "embed_mode") == int(embed), f"node {node.name!r}: embed_mode is not {embed}")
        source = attr(node, "source")
        expect(bool(source), f"node {node.name!r} records no source")
    produced = {p.name for p in folder.iterdir()} - {"model.onnx"}
    binaries = {p for p in produced if p.endswith(".bin")}
    if embed == "1":
        expect(produced == {made.ctx.name}, f"embed_mode=1 wrote {sorted(produced)}, expected only the model")
        main = next(n for n in nodes if attr(n, "main_context") in (None, 1))
        blob = attr(main, "ep_cache_context")
        expect(isinstance(blob, bytes) and blob.startswith(b"EPCTXBIN"), "the embedded context is no binary")
    else:
        expect(len(binaries) == 1 and produced == {made.ctx.name, *binaries},
                f"embed_mode=0 wrote {sorted(produced)}, expected the model and one binary")  # fmt: skip
    loaded = suite.session(made.ctx, load=True)
    parts = loaded.get_partitions()
    ours = [n for ep, names in parts if ep == suite.ep for n in names]
    expect(set(ours) == {n.name for n in nodes}, f"the loaded session runs {ours} on {suite.ep}")
    suite.compare(record, loaded.run(None, feeds), expected, "loaded in this process")
    if embed == "1":  # an embedded context needs no file: it loads from bytes
        suite.compare(record, suite.session(made.ctx.read_bytes(), load=True).run(None, feeds), expected,
                      "loaded from bytes")  # fmt: skip
    (result,) = suite.fresh_process([{"model": str(made.ctx), "out": str(folder / "fresh.npy")}])
    expect(result["ok"], f"fresh process with {NO_COMPILE_ENV}=1: {result.get('message')}")
    suite.compare(record, [np.load(folder / "fresh.npy")], expected[:1], "loaded in a fresh process")
    record.notes.append(f"{len(nodes)} EPContext node(s), fresh process ok")


def _case_round_trip_embed0(suite: Suite, record: Record) -> None:
    _round_trip(suite, record, "0")


def _case_round_trip_embed1(suite: Suite, record: Record) -> None:
    _round_trip(suite, record, "1")


def _case_partial_model(suite: Suite, record: Record) -> None:
    folder = suite.folder("model")
    model = models.partial()
    made = suite.generate(record, folder, "model", model)
    feeds = models.feeds()
    expected = suite.oracle("partial", model, feeds)
    suite.compare(record, [made.output], expected[:1], "generating session")
    expect("ln" not in made.delegated,
            f"{suite.ep} took LayerNormalization: no CPU node between its partitions (give case_options "
            "for 'partial_model' that leave LayerNormalization to the CPU EP)")  # fmt: skip
    import onnx

    graph = onnx.load(made.ctx, load_external_data=False).graph
    nodes = ctx_nodes(made.ctx)
    others = [n.op_type for n in graph.node if n.op_type != OP_TYPE]
    expect(len(nodes) >= 2, f"expected two EP partitions around the CPU node, found {len(nodes)}")
    expect("LayerNormalization" in others, f"the CPU node is missing from the context model: {others}")
    mains = [n for n in nodes if attr(n, "main_context") in (None, 1)]
    expect(len(mains) == 1, f"{len(mains)} main contexts for one EP and one binary")
    loaded = suite.session(made.ctx, load=True)
    on_cpu = [n for ep, names in loaded.get_partitions() if ep != suite.ep for n in names]
    expect("ln" in on_cpu, f"the loaded session does not run 'ln' on the CPU EP: {on_cpu}")
    suite.compare(record, loaded.run(None, feeds), expected, "loaded")
    record.notes.append(f"{len(nodes)} partitions around {others}")


def _case_prefix_merge(suite: Suite, record: Record) -> None:
    folder = suite.folder("models")
    first = suite.generate(record, folder, "first", models.chain(), ep__context_node_name_prefix="a_")
    feeds = models.feeds()
    y = suite.oracle("chain0", models.chain(), feeds)[0]
    second = suite.generate(record, folder, "second", models.second_stage(), {"y": y},
                            ep__context_node_name_prefix="b_")  # fmt: skip
    for made, prefix in ((first, "a_"), (second, "b_")):
        nodes = ctx_nodes(made.ctx)
        names = [n.name for n in nodes] + [graph_of(n) for n in nodes]
        expect(
            all(n.startswith(prefix) for n in names), f"{made.ctx.name}: names without {prefix!r}: {names}"
        )
        for node in nodes:
            if attr(node, "main_context") in (None, 1):
                with ContextBinary.open(
                    made.folder / bytes(attr(node, "ep_cache_context")).decode()
                ) as binary:
                    graphs = binary.names()
                expect(
                    all(g.startswith(prefix) for g in graphs), f"binary entries without {prefix!r}: {graphs}"
                )
    merged = folder / "merged.onnx"
    merge_context_models([first.ctx, second.ctx], merged)
    sess = suite.session(merged, load=True)
    expect([i.name for i in sess.get_inputs()] == ["x"] and [o.name for o in sess.get_outputs()] == ["z"],
            "the merged model's inputs and outputs are not x -> z")  # fmt: skip
    expected = suite.oracle("second", models.second_stage(), {"y": y})
    suite.compare(record, sess.run(None, feeds), expected, "merged model")
    record.notes.append(f"merged {len(ctx_nodes(merged))} EPContext nodes")


def _case_weight_sharing(suite: Suite, record: Record) -> None:
    folder = suite.folder("models")
    n = 3
    made = []
    for k in range(n):
        stop = "1" if k == n - 1 else "0"  # the last model of the group writes the files
        model = models.shared_variant(k)
        made.append(
            suite.generate(
                record, folder, f"m{k}", model, ep__share_ep_contexts="1", ep__stop_share_ep_contexts=stop
            )
        )
    feeds = models.feeds()
    for k, g in enumerate(made):
        expected = suite.oracle(f"shared{k}", models.shared_variant(k), feeds)
        suite.compare(record, [g.output], expected[:1], f"generating session {k}")
    produced = sorted({p.name for p in folder.iterdir()} - {f"m{k}.onnx" for k in range(n)})
    binaries = [p for p in produced if p.endswith(".bin")]
    expect(
        len(produced) == n + 1 and len(binaries) == 1, f"{n} models wrote {produced}, expected {n + 1} files"
    )
    # Shared weights are stored once: one payload of kind "weights" serves the graphs of every model.
    graphs_of = {k: {graph_of(node) for node in ctx_nodes(g.ctx)} for k, g in enumerate(made)}
    with ContextBinary.open(folder / binaries[0]) as binary:
        users: dict[tuple[int, int], set[int]] = {}
        for name in binary.names():
            info = binary.entry(name)
            if info.kind != "weights" or info.size == 0:
                continue
            for k, graphs in graphs_of.items():
                if any(name.startswith(f"{graph}/") for graph in graphs):
                    users.setdefault((info.offset, info.size), set()).add(k)
    shared = [size for (_, size), ks in users.items() if len(ks) == n]
    expect(
        bool(shared),
        f"no payload of kind 'weights' is stored once for all {n} models (W1 and B1 are the same)",
    )
    # Inference: the sessions of the group open the shared binary once.
    sessions = []
    with counting_binary_opens() as opened:
        for k, g in enumerate(made):
            stop = "1" if k == n - 1 else "0"
            sessions.append(
                suite.session(g.ctx, load=True, ep__share_ep_contexts="1", ep__stop_share_ep_contexts=stop)
            )
    expect(len(opened) == 1, f"{n} sharing sessions opened the binary {len(opened)} times")
    del sessions[0]  # the session that opened it closes first; the others still run
    for k, sess in enumerate(sessions, start=1):
        suite.compare(record, sess.run(None, feeds), suite.oracle(f"shared{k}", models.shared_variant(k), feeds),
                      f"sharing session {k}")  # fmt: skip
    record.notes.append(f"{n + 1} files, {len(shared)} weight payload(s) stored once, binary opened once")


def _case_corrupted_binary(suite: Suite, record: Record) -> None:
    ctx, binary_path = suite.copy_base(record)
    with ContextBinary.open(binary_path) as binary:
        largest = max((binary.entry(name) for name in binary.names()), key=lambda e: e.size)
    expect(largest.size > 0, "the binary holds no payload")
    data = bytearray(binary_path.read_bytes())
    data[largest.offset + largest.size // 2] ^= 0x10
    binary_path.write_bytes(bytes(data))
    suite.expect_invalid_graph(record, ctx, f"a bit flipped in payload {largest.name!r}")


def _case_foreign_binary(suite: Suite, record: Record) -> None:
    ctx, binary_path = suite.copy_base(record)
    other = suite.base(Record(), "chain1", seed=1)  # the same graph with other weights
    (foreign,) = [p for p in other.folder.iterdir() if p.suffix == ".bin"]
    shutil.copyfile(foreign, binary_path)
    suite.expect_invalid_graph(record, ctx, "another model's binary")


def _case_sdk_version_mismatch(suite: Suite, record: Record) -> None:
    ctx, binary_path = suite.copy_base(record)
    with ContextBinary.open(binary_path) as binary:
        made_with = binary.sdk_version
    rewrite_binary(binary_path, ctx, sdk_version=f"{made_with}-conformance.other")
    suite.expect_invalid_graph(record, ctx, "a binary of another SDK version")


def _case_hardware_mismatch(suite: Suite, record: Record) -> None:
    ctx, binary_path = suite.copy_base(record)
    rewrite_binary(binary_path, ctx, hardware="conformance/other-hardware")
    suite.expect_invalid_graph(record, ctx, "a binary for other hardware")


def _case_no_compile_on_load(suite: Suite, record: Record) -> None:
    made = suite.base(record, "chain0")
    # The guard holds: a session that must compile raises, naming the EP.
    try:
        suite.session(made.source, load=True)
    except ModelRequiresCompilation as exc:
        expect(suite.ep in str(exc), f"the no-compile error does not name {suite.ep}: {exc}")
    else:
        raise CaseFailed("a session on the source model compiled inside no_compile()")
    try:  # session.disable_model_compile=1 too, capability checks that compile included
        suite.session(made.source, session__disable_model_compile="1")
    except ModelRequiresCompilation as exc:
        expect(suite.ep in str(exc), f"the disable_model_compile error does not name {suite.ep}: {exc}")
    else:
        raise CaseFailed("a session on the source model compiled with session.disable_model_compile=1")
    # Loading the context model compiles nothing, here and in a fresh process with EPCTX_NO_COMPILE=1.
    feeds = models.feeds()
    expected = suite.oracle("chain0", models.chain(), feeds)
    suite.compare(record, suite.session(made.ctx, load=True).run(None, feeds), expected, "loaded")
    out = suite.tmp / suite.case / "fresh.npy"
    guard, load = suite.fresh_process(
        [{"model": str(made.source), "out": str(out)}, {"model": str(made.ctx), "out": str(out)}]
    )
    expect(not guard["ok"] and guard["error"] == "ModelRequiresCompilation",
            f"{NO_COMPILE_ENV}=1 did not stop a compile: {guard}")  # fmt: skip
    expect(load["ok"], f"fresh process with {NO_COMPILE_ENV}=1: {load.get('message')}")
    suite.compare(record, [np.load(out)], expected[:1], "loaded in a fresh process")
    record.notes.append(
        f"{NO_COMPILE_ENV}=1, no_compile() and session.disable_model_compile=1 refuse to compile"
    )


CASE_BODIES: dict[str, Callable[[Suite, Record], None]] = {
    "round_trip_embed0": _case_round_trip_embed0,
    "round_trip_embed1": _case_round_trip_embed1,
    "partial_model": _case_partial_model,
    "prefix_merge": _case_prefix_merge,
    "weight_sharing": _case_weight_sharing,
    "corrupted_binary": _case_corrupted_binary,
    "foreign_binary": _case_foreign_binary,
    "sdk_version_mismatch": _case_sdk_version_mismatch,
    "hardware_mismatch": _case_hardware_mismatch,
    "no_compile_on_load": _case_no_compile_on_load,
}
