"""What an attacker who can write the model folder does, with epctx's own writer (every checksum and identity
recomputed): the files stay well-formed, so only a signature can tell."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx

from epctx.epcontext import ContextBinary, ContextBinaryWriter
from epctx.epcontext.identity import IDENTITY_ATTRIBUTE, graph_identity


def _binary_of(ctx: Path) -> Path:
    model = onnx.load(ctx, load_external_data=False)
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.name == "ep_cache_context":
                return ctx.parent / attr.s.decode()
    raise AssertionError(f"{ctx} has no binary file")


def rebind_identities(ctx: Path) -> None:
    """Record in each EPContext node the identity of the graph its binary holds now (what ``inspect --verify``
    and the loader check): the model then names the forged binary as its own."""
    binary_path = _binary_of(ctx)
    model = onnx.load(ctx, load_external_data=False)
    with ContextBinary.open(binary_path) as binary:
        rows = [(i.name, i.kind, i.size, i.checksum, i.attrs) for i in map(binary.entry, binary.names())]
        for node in model.graph.node:
            graph = next((a.s.decode() for a in node.attribute if a.name == "partition_name"), None)
            for attr in node.attribute:
                if attr.name == IDENTITY_ATTRIBUTE and graph is not None:
                    mine = [r for r in rows if r[0].startswith(f"{graph}/")]
                    attr.s = graph_identity(graph, mine, binary.checksum_algorithm).encode()
    onnx.save(model, ctx)


def forge_weights(ctx: Path) -> None:
    """Negate the first float weights entry of the context binary, rewrite it with epctx's writer (valid
    checksums) and rebind the model's identities: a tampered binary every integrity check accepts."""
    path = _binary_of(ctx)
    with ContextBinary.from_bytes(path.read_bytes()) as binary:
        writer = ContextBinaryWriter(
            ep_name=binary.ep_name, sdk_version=binary.sdk_version, hardware=binary.hardware,
            metadata=dict(binary.metadata),
        )  # fmt: skip
        done = False
        for name in binary.names():
            info = binary.entry(name)
            data = bytes(binary.read(name))
            if not done and info.attrs.get("dtype") == "float32":
                data = (-np.frombuffer(data, np.float32)).tobytes()
                done = True
            writer.add(name, data, kind=info.kind, attrs=dict(info.attrs))
    assert done, "no float32 entry to forge"
    writer.write(path)
    rebind_identities(ctx)


def swap_binary(ctx: Path, other_ctx: Path) -> None:
    """Put another model's well-formed binary (same I/O) in place of ``ctx``'s, and rebind the identities."""
    shutil.copyfile(_binary_of(other_ctx), _binary_of(ctx))
    model = onnx.load(ctx, load_external_data=False)
    other = onnx.load(other_ctx, load_external_data=False)
    for node, theirs in zip(model.graph.node, other.graph.node):
        for attr in node.attribute:
            if attr.name == "partition_name":
                attr.s = next(a.s for a in theirs.attribute if a.name == "partition_name")
    onnx.save(model, ctx)
    rebind_identities(ctx)
