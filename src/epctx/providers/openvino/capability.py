"""Which nodes OpenVINO runs, as OpenVINO itself says: no hand-kept op list.

The candidate nodes (typed, not disabled, not EPContext) are extracted as one ONNX model and converted with
OpenVINO's ONNX frontend in *partial* mode, so an op it cannot translate becomes a placeholder instead of
failing the whole model; ``Core.query_model`` then names the OpenVINO operations the device supports. The
frontend gives the operations that produce an ONNX value that value's name; the operations a translation
creates in between carry no ONNX name and belong to the nodes that consume them. A node is claimed when it
maps to at least one operation and the device supports all of its operations.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import onnx_ir as ir

from epctx.ep import is_ep_context, make_partition, outer_scope_values
from epctx.providers.openvino.onnx_bridge import bind_weights, in_memory_model
from epctx.providers.openvino.probe import CONTROL_FLOW, ProbeVerdict, body_models, probe_compile

__all__ = ["candidate_nodes", "supported_nodes"]

_SKIPPED_OPS = ("Result",)
# Probe compiles one capability query may make (each settles one control-flow operation the device's query
# left out): a bound on what a model with many such If nodes costs to partition.
_MAX_PROBES = 4


def _untyped(values: Sequence[ir.Value | None]) -> ir.Value | None:
    return next((v for v in values if v is not None and v.type is None and v.const_value is None), None)


def candidate_nodes(
    graph: ir.Graph, disabled_ops: frozenset[str]
) -> tuple[list[ir.Node], dict[ir.Node, str]]:
    """Nodes worth asking OpenVINO about (every value they read or write has a known type), and why each
    other node (EPContext nodes aside) is not one."""
    found: list[ir.Node] = []
    declined: dict[ir.Node, str] = {}
    for node in graph:
        if is_ep_context(node):
            continue
        if node.op_type in disabled_ops:
            declined[node] = f"{node.op_type} is in the provider option disabled_ops"
            continue
        untyped = _untyped([*node.inputs, *node.outputs, *outer_scope_values(node)])
        if untyped is None:
            found.append(node)
        else:
            declined[node] = (
                f"value {untyped.name!r} has no known type (ONNX shape inference could not type it)"
            )
    return found, declined


def _ops_by_node(ov_model: Any, node_of_value: Mapping[str, ir.Node]) -> dict[ir.Node, list[str]]:
    """Friendly names of the OpenVINO operations each ONNX node became."""
    ops = list(ov_model.get_ordered_ops())
    owners: dict[int, set[ir.Node]] = {}
    for k, op in enumerate(ops):
        names = {name for output in op.outputs() for name in output.get_names()}
        owners[k] = {node_of_value[name] for name in names if name in node_of_value}
    index = {op.get_friendly_name(): k for k, op in enumerate(ops)}
    for k in range(len(ops) - 1, -1, -1):  # unnamed intermediate operations: owned by their consumers' nodes
        op = ops[k]
        if owners[k] or op.get_type_name() == "Parameter":
            continue
        for output in op.outputs():
            for target in output.get_target_inputs():
                j = index.get(target.get_node().get_friendly_name())
                if j is not None:
                    owners[k] |= owners[j]
    result: dict[ir.Node, list[str]] = {}
    for k, op in enumerate(ops):
        if op.get_type_name() in _SKIPPED_OPS:
            continue
        for node in owners[k]:
            result.setdefault(node, []).append(op.get_friendly_name())
    return result


def _is_placeholder(op: Any) -> bool:
    """An operation the frontend could not translate (kept in place by partial conversion), or a
    control-flow operation with one in its bodies."""
    kind = op.get_type_name()
    if "FrameworkNode" in kind or kind.startswith("NotSupported"):
        return True
    return any(_is_placeholder(inner) for body in body_models(op) for inner in body.get_ordered_ops())


def supported_nodes(
    core: Any,
    device: str,
    config: Mapping[str, Any],
    graph: ir.Graph,
    opset_imports: Mapping[str, int],
    candidates: Sequence[ir.Node],
) -> tuple[list[ir.Node], dict[ir.Node, str]]:
    """The candidates OpenVINO's ONNX frontend translates and ``device`` supports, in graph order; and
    OpenVINO's reason for each other candidate (``reasons``).

    Nodes the frontend cannot translate (in their bodies too) are dropped and the rest converted again, so
    that the device is queried on a model whose every value has a known type (a placeholder's outputs have
    none); a control-flow node the device's query leaves out is settled by a probe compile (``probe``)."""
    from openvino.frontend import FrontEndManager

    frontend = FrontEndManager().load_by_framework("onnx")
    remaining = list(candidates)
    declined: dict[ir.Node, str] = {}
    probes = 0
    while remaining:
        found = _ask(core, device, config, frontend, graph, opset_imports, remaining, probes < _MAX_PROBES)
        probes += found.probed
        declined.update(found.declined)
        if found.claimed is not None:
            return found.claimed, declined
        dropped = set(found.declined)
        remaining = [n for n in remaining if n not in dropped]
    return [], declined


class _Answer:
    """One round's answer: the claimed nodes (None: ask again without those ``declined``) and reasons."""

    __slots__ = ("claimed", "declined", "probed")

    def __init__(
        self, claimed: list[ir.Node] | None, declined: dict[ir.Node, str], probed: bool = False
    ) -> None:
        self.claimed = claimed
        self.declined = declined
        self.probed = probed  # a probe compile was made


def _ask(
    core: Any,
    device: str,
    config: Mapping[str, Any],
    frontend: Any,
    graph: ir.Graph,
    opset_imports: Mapping[str, int],
    remaining: list[ir.Node],
    may_probe: bool,
) -> _Answer:
    """Convert ``remaining`` as one model and ask the device about it (a round of :func:`supported_nodes`)."""
    from epctx.providers.openvino.reasons import frontend_reasons

    part = make_partition("capability", "OpenVINOExecutionProvider", graph, remaining, opset_imports)
    data, keep, shared = in_memory_model(part)
    ov_model = bind_weights(frontend.convert_partially(frontend.load(io.BytesIO(data))), shared)
    ops = _ops_by_node(ov_model, {v.name: n for n in remaining for v in n.outputs if v.name})
    placeholders = {op.get_friendly_name() for op in ov_model.get_ordered_ops() if _is_placeholder(op)}
    untranslated = [node for node in remaining if placeholders.intersection(ops.get(node, ()))]
    if untranslated:
        del ov_model
        return _Answer(None, frontend_reasons(frontend, frontend.load(io.BytesIO(data)), untranslated))
    supported = set(core.query_model(ov_model, device, dict(config)))
    kinds = {op.get_friendly_name(): op.get_type_name() for op in ov_model.get_ordered_ops()}
    verdict: ProbeVerdict | None = None
    if may_probe and any(kinds[name] in CONTROL_FLOW for name in kinds if name not in supported):
        verdict = probe_compile(core, ov_model, device, config)
    del ov_model, keep, shared  # the model may point into the arrays: release it first
    return _answer(remaining, ops, supported, kinds, device, verdict)


def _answer(
    remaining: list[ir.Node],
    ops: Mapping[ir.Node, list[str]],
    supported: set[str],
    kinds: Mapping[str, str],
    device: str,
    verdict: ProbeVerdict | None,
) -> _Answer:
    """The round's answer from the device's query and the probe compile's verdict (None: none made)."""
    if verdict is not None and verdict.compiled:
        return _Answer(list(remaining), {}, True)  # the plugin compiles what its query left out
    said = ""  # the probe's words where they name no node's operation (an input of unknown rank, say)
    if verdict is not None:
        named = [node for node in remaining if verdict.operation in ops.get(node, ())]
        if named:
            why = f"OpenVINO's {device} plugin refused to compile it: {verdict.message} (Core.compile_model)"
            return _Answer(None, dict.fromkeys(named, why), True)
        said = f"; compiled, the {device} plugin says: {verdict.message}"
        said += f" (operation {verdict.operation!r})" if verdict.operation else ""
    claimed: list[ir.Node] = []
    declined: dict[ir.Node, str] = {}
    for node in remaining:
        refused = _device_reason(ops.get(node, []), supported, kinds, device)
        if refused is None:
            claimed.append(node)
        else:
            declined[node] = refused + said
    return _Answer(claimed, declined, verdict is not None)


def _device_reason(
    names: list[str], supported: set[str], kinds: Mapping[str, str], device: str
) -> str | None:
    """Why a translated node is not claimed (None: it is): the device's ``query_model`` left out operations."""
    if not names:
        return "OpenVINO's ONNX frontend made no operation of it (nothing left to run once translated)"
    missing = [name for name in names if name not in supported]
    if not missing:
        return None
    shown = ", ".join(f"{kinds.get(name, '?')} {name!r}" for name in missing[:4])
    more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
    return f"OpenVINO's {device} device does not support its operation(s) {shown}{more} (Core.query_model)"
