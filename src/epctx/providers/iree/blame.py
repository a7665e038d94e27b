"""The nodes a failed IREE compile names: IREE's diagnostics quote the operation they are about, as the ONNX
importer wrote it (``%7 = torch.operator "onnx.ConvTranspose"(%6, %1) {...} : (!torch.vtensor<[?,24,?,?],f32>,
!torch.vtensor<[24,24,2,2],f32>) -> !torch.vtensor<[?,24,?,?],f32>``). A node of the compiled group is named
when it agrees with the quoted operation: its op type; its integer attributes (``torch.onnx.kernel_shape = [3 :
si64, 3 : si64]``); where each operand comes from (``%arg2``: from outside the group; ``%303#1``: the second
result of a node with several, a Split's; ``%61``: a constant, or a node of the group with one result); its
inputs' and first output's ranks and static sizes (a ``?`` agrees with any size, and so does a value whose shape
is not known). Types alone named 17 of nudenet's Convs (all 64x64x3x3, dynamic sizes) where IREE quoted one (the
Conv reading a Split's second result); the operands' sources name 1. The capability search
leaves the named nodes out and compiles the rest at once (``probing``), before it bisects: PP-OCRv4 det, compiled
whole with its dynamic sizes, fails in IREE's code generation (``failed to resolve workgroup count hint``) on a
Conv and a ConvTranspose of its head; its other 490 nodes compile (3 groups).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import onnx_ir as ir

__all__ = ["is_codegen_failure", "named_nodes"]

_OPERATION = re.compile(r'torch\.operator "onnx\.(\w+)"\(([^)]*)\)(?: \{(.*)\})? : \((.*)\) -> (.*)$')
_TENSOR = re.compile(r"vtensor<\[([^\]]*)\],\s*\w+>")
_ATTRIBUTE = re.compile(r"torch\.onnx\.(\w+) = (\[[^\]]*\]|-?\d+ : si64)")
_INTEGER = re.compile(r"(-?\d+) : si64")
Dims = tuple[int | None, ...]
# IREE's message when code generation fails for a dispatch: after the input conversion and the preprocessing
# (channels-last) passes, so compiling in ONNX's layout would not help.
_CODEGEN = "failed to run translation of source executable"


@dataclasses.dataclass(frozen=True)
class _Quoted:
    op_type: str
    sources: tuple[str, ...]  # each operand: "%arg0", "%303#1", "%61"
    attributes: dict[str, int | tuple[int, ...]]
    operands: tuple[Dims, ...]
    results: tuple[Dims, ...]


def is_codegen_failure(error: str) -> bool:
    """Whether IREE failed in code generation (see ``_CODEGEN``)."""
    return _CODEGEN in error


def _quoted(error: str) -> list[_Quoted]:
    """The operations IREE's message quotes; None for a ``?`` size."""
    found = []
    for line in error.splitlines():
        match = _OPERATION.search(line.strip())
        if match is None:
            continue
        attributes: dict[str, int | tuple[int, ...]] = {}
        for name, text in _ATTRIBUTE.findall(match[3] or ""):
            numbers = tuple(int(n) for n in _INTEGER.findall(text))
            attributes[name] = numbers if text.startswith("[") else numbers[0]
        found.append(_Quoted(
            match[1], tuple(r.strip() for r in match[2].split(",") if r.strip()), attributes,
            tuple(_dims(t) for t in _TENSOR.findall(match[4])), tuple(_dims(t) for t in _TENSOR.findall(match[5])),
        ))  # fmt: skip
    return found


def _dims(text: str) -> Dims:
    return tuple(None if d.strip() == "?" else int(d) for d in text.split(",") if d.strip())


def _agrees(value: ir.Value | None, dims: Dims) -> bool:
    """Whether ``value``'s shape (a constant's, else its inferred one) agrees with ``dims``; an unknown shape
    agrees (the graph a session partitions need not carry the shapes of the values its passes made)."""
    if value is None:
        return False
    shape = value.const_value.shape if value.const_value is not None else value.shape
    if shape is None:
        return True
    if len(shape) != len(dims):
        return False
    return all(q is None or not isinstance(d, int) or d == q for d, q in zip(shape, dims))


def _same_source(value: ir.Value, source: str, group: set[ir.Node]) -> bool:
    """Whether ``value`` may be the operand the module names ``source`` (see the module)."""
    producer = value.producer()
    inside = producer is not None and producer in group
    several = inside and producer is not None and len(producer.outputs) > 1
    if source.startswith("%arg"):
        return not inside and value.const_value is None
    if "#" in source:
        index = source.rsplit("#", 1)[1]
        return (
            several
            and index.isdigit()
            and producer is not None
            and list(producer.outputs).index(value) == int(index)
        )
    return not several and (inside or value.const_value is not None)


def _same_attributes(node: ir.Node, attributes: dict[str, int | tuple[int, ...]]) -> bool:
    for name, quoted in attributes.items():
        attr = node.attributes.get(name)
        if attr is None or not isinstance(attr, ir.Attr):
            continue
        value = attr.value
        mine = tuple(value) if isinstance(value, (list, tuple)) else value
        if isinstance(mine, (int, tuple)) and mine != quoted:
            return False
    return True


def _is(node: ir.Node, quoted: _Quoted, group: set[ir.Node]) -> bool:
    if node.op_type != quoted.op_type or node.domain not in ("", "ai.onnx"):
        return False
    inputs = [v for v in node.inputs if v is not None]
    if len(inputs) != len(quoted.operands) or not quoted.results or not node.outputs:
        return False
    if len(quoted.sources) == len(inputs) and not all(
        _same_source(v, s, group) for v, s in zip(inputs, quoted.sources)
    ):
        return False
    return (
        _same_attributes(node, quoted.attributes)
        and all(_agrees(v, d) for v, d in zip(inputs, quoted.operands))
        and _agrees(node.outputs[0], quoted.results[0])
    )


def named_nodes(error: str, group: Sequence[ir.Node]) -> list[ir.Node]:
    """The nodes of ``group`` (in its order) that an operation quoted in IREE's ``error`` may be (see the
    module); none when the message quotes no operation, or none of the group agrees."""
    members = set(group)
    named: dict[ir.Node, None] = {}
    for quoted in _quoted(error):
        named.update(dict.fromkeys(n for n in group if n not in named and _is(n, quoted, members)))
    return [n for n in group if n in named]
