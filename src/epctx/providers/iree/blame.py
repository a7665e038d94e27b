"""The nodes a failed IREE compile names: IREE's diagnostics quote the operation they are about, as the ONNX
importer wrote it (``%7 = torch.operator "onnx.ConvTranspose"(%6, %1) {...} : (!torch.vtensor<[?,24,?,?],f32>,
!torch.vtensor<[24,24,2,2],f32>) -> !torch.vtensor<[?,24,?,?],f32>``). A node of the compiled group is named
when its op type is the quoted one and its inputs' and first output's ranks and static sizes agree with the
quoted types (a ``?`` agrees with any size, and so does a value whose shape is not known). The capability search
leaves the named nodes out and compiles the rest at once (``probing``), before it bisects: PP-OCRv4 det, compiled
whole with its dynamic sizes, fails in IREE's code generation (``failed to resolve workgroup count hint``) on a
Conv and a ConvTranspose of its head; its other 490 nodes compile (3 groups).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import onnx_ir as ir

__all__ = ["is_codegen_failure", "named_nodes"]

_OPERATION = re.compile(r'torch\.operator "onnx\.(\w+)"\(.*?\)(?: \{.*\})? : \((.*)\) -> (.*)$')
_TENSOR = re.compile(r"vtensor<\[([^\]]*)\],\s*\w+>")
Dims = tuple[int | None, ...]
# IREE's message when code generation fails for a dispatch: after the input conversion and the preprocessing
# (channels-last) passes, so compiling in ONNX's layout would not help.
_CODEGEN = "failed to run translation of source executable"


def is_codegen_failure(error: str) -> bool:
    """Whether IREE failed in code generation (see ``_CODEGEN``)."""
    return _CODEGEN in error


def _quoted(error: str) -> list[tuple[str, list[Dims], list[Dims]]]:
    """The operations IREE's message quotes: (op type, operand dims, result dims); None for a ``?`` size."""
    found = []
    for line in error.splitlines():
        match = _OPERATION.search(line.strip())
        if match is None:
            continue
        operands = [_dims(text) for text in _TENSOR.findall(match[2])]
        results = [_dims(text) for text in _TENSOR.findall(match[3])]
        found.append((match[1], operands, results))
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


def named_nodes(error: str, group: Sequence[ir.Node]) -> list[ir.Node]:
    """The nodes of ``group`` (in its order) that an operation quoted in IREE's ``error`` may be (see the
    module); none when the message quotes no operation, or none of the group agrees."""
    named: dict[ir.Node, None] = {}
    for op_type, operands, results in _quoted(error):
        for node in group:
            if node.op_type != op_type or node.domain not in ("", "ai.onnx") or node in named:
                continue
            inputs = [v for v in node.inputs if v is not None]
            if len(inputs) != len(operands) or not results or not node.outputs:
                continue
            if all(_agrees(v, d) for v, d in zip(inputs, operands)) and _agrees(node.outputs[0], results[0]):
                named[node] = None
    return list(named)
