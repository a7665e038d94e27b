"""What OpenVINO says about control flow that ``Core.query_model`` leaves out: its plugin's own verdict.

``query_model`` answers per operation and is silent on why: it leaves out an ``If`` whose branches differ in
rank (silero-vad's "squeeze if the last dimension is 1" blocks), and on a model of little else (``x -> If ->
Relu``) it returns nothing at all, the ``Relu`` and the parameters included. ``compile_model`` names the
operation and the reason::

    Check '!shape.rank().is_dynamic()' failed at src/plugins/intel_cpu/src/node.cpp:108:
    Unexpected: CPU plug-in doesn't support If operation with dynamic rank. Operation name: theif

So when the query leaves out a control-flow operation (``If``, ``Loop``, ``TensorIterator``: ONNX ``If``,
``Loop``, ``Scan``), the candidates are compiled once (a probe, not kept): where the plugin compiles them all,
the query was too cautious and every candidate is OpenVINO's; where it refuses one named operation, that
operation's node is declined with the plugin's words and the rest asked again. Only then: a model without
control flow costs no extra compile.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["CONTROL_FLOW", "ProbeVerdict", "body_models", "probe_compile"]

# OpenVINO operation types with bodies (ONNX If -> If, Loop -> Loop, Scan -> TensorIterator)
CONTROL_FLOW = frozenset({"If", "Loop", "TensorIterator"})
_OPERATION = re.compile(r"Operation name: ([^\s]+)")
_LOCATION = re.compile(r"^(Check '.*' failed at \S+|Exception from \S+)\s*")
_CHARS = 300


def body_models(op: Any) -> tuple[Any, ...]:
    """The bodies of an OpenVINO control-flow operation (none for another operation)."""
    kind = op.get_type_name()
    if kind == "If":
        return (op.get_then_body(), op.get_else_body())
    if kind in ("Loop", "TensorIterator"):
        return (op.get_function(),)
    return ()


class ProbeVerdict:
    """A probe compile's outcome: ``compiled``, or the operation the plugin named (``operation``, may be
    None) and its words (``message``)."""

    __slots__ = ("compiled", "message", "operation")

    def __init__(self, compiled: bool, operation: str | None = None, message: str = "") -> None:
        self.compiled = compiled
        self.operation = operation
        self.message = message


def probe_compile(core: Any, ov_model: Any, device: str, config: Mapping[str, Any]) -> ProbeVerdict:
    """Compile ``ov_model`` on ``device`` and drop the result; what the plugin said if it refused."""
    try:
        compiled = core.compile_model(ov_model, device, dict(config))
    except RuntimeError as exc:
        text = str(exc)
        found = _OPERATION.search(text)
        return ProbeVerdict(False, found.group(1) if found else None, plugin_message(text))
    del compiled
    return ProbeVerdict(True)


def plugin_message(text: str) -> str:
    """The plugin's words from an OpenVINO exception: without source locations, ``Unexpected:`` or the
    operation's name, on one line."""
    lines = []
    for line in text.splitlines():
        line = _LOCATION.sub("", _LOCATION.sub("", line.strip()))
        if line:
            lines.append(line)
    message = " ".join(lines).removeprefix("Unexpected: ")
    message = _OPERATION.sub("", message).strip().rstrip(".") or "no message"
    return message if len(message) <= _CHARS else message[:_CHARS] + "..."
