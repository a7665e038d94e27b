"""Reading and tampering with context models and binaries, for the conformance cases."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epctx.ep._context_node import DOMAIN, OP_TYPE
from epctx.epcontext.container import ContextBinary
from epctx.epcontext.writer import ContextBinaryWriter

if TYPE_CHECKING:
    import onnx


__all__ = ["attr", "counting_binary_opens", "ctx_nodes", "graph_of", "reason", "rewrite_binary"]


def ctx_nodes(path: Path) -> list[onnx.NodeProto]:
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    return [n for n in graph.node if n.op_type == OP_TYPE and n.domain == DOMAIN]


def attr(node: onnx.NodeProto, name: str) -> Any:
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)


def reason(exc: BaseException) -> str:
    """An error's message without its status and the node it names (the table has room for the reason)."""
    text = re.sub(r"^\[\w+\] (EPContext node '[^']*' \(source '[^']*'\):? ?)?", "", str(exc))
    text = re.sub(r"'(?:/|[A-Za-z]:\\)[^']*[/\\]([^'/\\]+)'", r"'\1'", text)  # absolute paths: file names
    return text.splitlines()[0] if text else type(exc).__name__


def graph_of(node: onnx.NodeProto) -> str:
    name = attr(node, "partition_name")
    return bytes(name).decode() if name else node.name


def rewrite_binary(binary_path: Path, ctx: Path, *, sdk_version: str | None = None,
                    hardware: str | None = None) -> None:  # fmt: skip
    """Give the binary's header and every EPContext node of ``ctx`` another SDK version or hardware."""
    import onnx
    from onnx import helper

    with ContextBinary.from_bytes(binary_path.read_bytes()) as binary:
        writer = ContextBinaryWriter(
            ep_name=binary.ep_name,
            sdk_version=binary.sdk_version if sdk_version is None else sdk_version,
            hardware=binary.hardware if hardware is None else hardware,
            metadata=binary.metadata,
            alignment=binary.alignment,
            checksum=binary.checksum_algorithm,
        )
        writer.add_from(binary)
        writer.write(binary_path)
    model = onnx.load(ctx, load_external_data=False)
    for node in model.graph.node:
        if node.op_type != OP_TYPE or node.domain != DOMAIN:
            continue
        for name, value in (("ep_sdk_version", sdk_version), ("hardware_architecture", hardware)):
            if value is None:
                continue
            kept = [a for a in node.attribute if a.name != name]
            del node.attribute[:]
            node.attribute.extend([*kept, helper.make_attribute(name, value)])
    onnx.save(model, ctx)


@contextlib.contextmanager
def counting_binary_opens() -> Iterator[list[str]]:
    """Records every context binary file opened inside the block."""
    opened: list[str] = []
    original = ContextBinary.__dict__["open"]

    def counting(cls: type[ContextBinary], path: str | os.PathLike[str]) -> ContextBinary:
        opened.append(os.fspath(path))
        binary: ContextBinary = original.__func__(cls, path)
        return binary

    ContextBinary.open = classmethod(counting)  # type: ignore[assignment,method-assign]
    try:
        yield opened
    finally:
        ContextBinary.open = original  # type: ignore[method-assign]
