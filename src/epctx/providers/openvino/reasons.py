"""Why OpenVINO declines a node, in OpenVINO's own words.

Partial conversion (what capability uses) keeps an untranslatable node as a placeholder and says nothing
more; a full ``FrontEnd.convert`` of the same input model fails with OpenVINO's report, which names each
failed node with the translator's message and lists the op types without a conversion rule::

    Model wasn't fully converted. Failed operations detailed log:
    -- Pad-19 with a message:
    While validating ONNX node '<Node(Pad): pd>': Exception from src/.../pad.cpp:32:
    Unsupported padding mode: [wrap]

    Summary:
    -- No conversion rule found for operations: StringNormalizer-18, my.dom.Foo

The report is asked for once, only when partial conversion left placeholders; these functions parse it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import onnx_ir as ir

from epctx.ep import node_subgraphs

__all__ = ["frontend_reasons", "node_reasons"]

_NODE = re.compile(r"<Node\(([^)]*)\): ([^>]*)>")
_NO_RULE = "No conversion rule found for operations:"
_LOCATION = re.compile(
    r"^(Check '.*' failed at \S+|Exception from \S+|While validating ONNX node '<[^>]*>':)\s*"
)
_CHARS = 400


def frontend_reasons(frontend: Any, model_input: Any, untranslated: Sequence[ir.Node]) -> dict[ir.Node, str]:
    """OpenVINO's reason for each of ``untranslated`` (placeholders of a partial conversion of
    ``model_input``), from a full conversion's report; a generic one where the report names nothing."""
    try:
        frontend.convert(model_input)
        report = ""
    except Exception as exc:  # OpConversionFailure (a RuntimeError subclass): its text is the report
        report = str(exc)
    return node_reasons(report, untranslated)


def node_reasons(report: str, nodes: Sequence[ir.Node]) -> dict[ir.Node, str]:
    """Each node's reason from the report: the translator's message naming it (by node or output name), or
    for a control-flow node the messages naming nodes of its bodies; else the op type's missing rule."""
    by_name, by_type = _parse(report)
    reasons: dict[ir.Node, str] = {}
    for node in nodes:
        why = _named(by_name, node) or by_type.get(_op_label(node)) or _in_bodies(by_name, by_type, node)
        reasons[node] = why or "OpenVINO's ONNX frontend could not translate it (partial conversion)"
    return reasons


def _named(by_name: dict[str, str], node: ir.Node) -> str | None:
    """The report names a node by its name, or (reading a model from a file) by its first output's name."""
    names = [node.name or "", *(v.name or "" for v in node.outputs[:1])]
    return next((by_name[name] for name in names if name and name in by_name), None)


def _in_bodies(by_name: dict[str, str], by_type: dict[str, str], node: ir.Node) -> str | None:
    """The report's messages about nodes inside ``node``'s bodies (nested ones too), up to three."""
    found: dict[str, None] = {}
    stack = list(node_subgraphs(node))
    while stack:
        for inner in stack.pop(0):
            why = _named(by_name, inner) or by_type.get(_op_label(inner))
            if why is not None:
                found.setdefault(f"{why} (node {inner.name!r} in its body)", None)
            stack.extend(node_subgraphs(inner))
    if not found:
        return None
    shown = list(found)[:3]
    more = f"; and {len(found) - 3} more" if len(found) > 3 else ""
    return "; ".join(shown) + more


def _op_label(node: ir.Node) -> str:
    return f"{node.domain}.{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type


def _parse(report: str) -> tuple[dict[str, str], dict[str, str]]:
    """(node name -> translator's message, op label -> "no conversion rule") from OpenVINO's report."""
    by_name: dict[str, str] = {}
    by_type: dict[str, str] = {}
    for block in re.split(r"^-- ", report, flags=re.MULTILINE)[1:]:
        head, _, body = block.partition("\n")
        if head.startswith(_NO_RULE):
            for label in head[len(_NO_RULE) :].split(","):
                op = label.strip()
                by_type[re.sub(r"-\d+$", "", op)] = (
                    f"OpenVINO's ONNX frontend has no conversion rule for {op}"
                )
        elif head.endswith("with a message:"):
            found = _NODE.search(body)
            if found is not None:
                op = head.removesuffix(" with a message:").strip()
                by_name[found.group(2)] = f"OpenVINO's ONNX frontend failed to convert {op}: {_message(body)}"
    return by_name, by_type


def _message(body: str) -> str:
    """The translator's words without OpenVINO's source locations, on one line."""
    text = body.split("\nSummary:", 1)[0]
    lines = []
    for line in text.splitlines():
        line = _LOCATION.sub("", line.strip())
        line = _LOCATION.sub("", line)
        if line and not line.startswith("While validating node "):
            lines.append(line)
    message = " ".join(lines) or "no message"
    return message if len(message) <= _CHARS else message[:_CHARS] + "..."
