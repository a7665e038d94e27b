"""The input and output names of each graph in a context binary, recorded by the framework at generation and
checked against the EPContext node at load, so no EP has to (entry ``<graph>/epctx.io``; EPs' own keys never
start with ``epctx.``)."""

from __future__ import annotations

from epctx.ep._context_node import EPContextNode
from epctx.ep._contract import Partition
from epctx.ep._documents import dump_document, load_document
from epctx.errors import InvalidGraph

__all__ = ["IO_KEY", "check_io_names", "io_document"]

IO_KEY = "epctx.io"
_FORMAT = "epctx.io"
_VERSION = 1


def io_document(partition: Partition) -> bytes:
    return dump_document(
        {
            "inputs": [v.name or "" for v in partition.inputs],
            "outputs": [v.name or "" for v in partition.outputs],
        },
        format=_FORMAT,
        version=_VERSION,
    )


def check_io_names(data: bytes | memoryview | None, node: EPContextNode, where: str) -> None:
    """The node reads and writes the values its graph was compiled for (no record: a binary made elsewhere,
    checked by its EP alone)."""
    if data is None:
        return
    doc = load_document(data, format=_FORMAT, version=_VERSION, where=where)
    recorded = (list(doc.get("inputs", [])), list(doc.get("outputs", [])))
    found = (list(node.inputs), list(node.outputs))
    if recorded != found:
        raise InvalidGraph(
            f"{where}: its graph reads {recorded[0]} and writes {recorded[1]}, but the node has inputs "
            f"{found[0]} and outputs {found[1]}"
        )
