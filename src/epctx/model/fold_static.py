"""Stated input values (``epctx.input_values``) folded into the graph at load, and the control flow they decide.

A model such as silero-vad branches on a scalar input (``If(sr == 16000)``), and inside each branch on shapes
("squeeze the last axis if it is 1", LSTM rank checks): OpenVINO's frontend cannot convert such an ``If`` (its
branches differ in rank), so the whole model ran on the CPU EP. With the input's value stated (and its shapes,
``epctx.input_shapes``), the graph it computes is known: the value becomes a constant; ONNX shape inference (with
data propagation) gives every value its sizes; ``Shape`` / ``Size`` of a value with static sizes and small nodes
whose inputs are all constants (at most ``_FOLD_ELEMENTS`` elements out) become constants; an ``If`` whose
condition is constant is replaced by the nodes of the branch it takes; again until nothing changes. silero-vad at
16 kHz and at 8 kHz (nodes in bodies counted): 25 ``If`` nodes -> 0, 690 nodes -> 113; onnxruntime running the
folded model gives bit for bit what it gives on the original (``tests/test_input_values.py``).

The stated input stays an input of the model (a feed must still give it, with that value: the session's feed
binder refuses another, ``epctx.session.feeds``). ``epctx.session.specialize`` states the values of such scalars
per run signature, as it states shapes. Works on the ``ModelProto`` before ``onnx-ir`` reads it (``load.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from epctx.errors import InvalidArgument

__all__ = ["deciding_scalars", "fold_stated_values"]

logger = logging.getLogger("epctx")

_FOLD_ELEMENTS = (
    1 << 16
)  # a folded node's output at most this many elements (shape math, masks, small tables)
_ROUNDS = 16
_NOT_FOLDED = frozenset({"If", "Loop", "Scan", "Constant", "SequenceConstruct"})
_RANDOM = ("Random", "Multinomial", "Bernoulli", "Dropout")
# Ops through which a scalar input decides an If's condition (``deciding_scalars``).
_CONDITION_OPS = frozenset({"Equal", "Not", "Cast", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "And",
                            "Or", "Xor", "Identity", "Squeeze", "Unsqueeze", "Reshape"})  # fmt: skip


def fold_stated_values(proto: onnx.ModelProto, values: Sequence[tuple[str, float]], what: str) -> None:
    """State ``values`` (input name, value) in ``proto`` and fold what they and the static shapes decide."""
    graph = proto.graph
    inputs = {i.name: i for i in graph.input}
    for name, value in values:
        if name not in inputs:
            raise InvalidArgument(
                f"{what}: epctx.input_values names {name!r}, which is no input of the model; its inputs: "
                f"{', '.join(inputs)}"
            )
        elem = inputs[name].type.tensor_type
        if not elem.HasField("shape") or len(elem.shape.dim) != 0:
            raise InvalidArgument(f"{what}: epctx.input_values states {name!r}, which is not a scalar input")
        dtype = helper.tensor_dtype_to_np_dtype(elem.elem_type)
        _replace_uses(graph, name, _constant_name(name), np.asarray(value, dtype=dtype))
    before = _count(graph, lambda n: True), _count(graph, lambda n: n.op_type == "If")
    for _ in range(_ROUNDS):
        shapes = _static_shapes(proto)
        if not _fold_graph(graph, shapes, {}):
            break
    _drop_dead_constants(graph)
    after = _count(graph, lambda n: True), _count(graph, lambda n: n.op_type == "If")
    logger.info(
        "%s: stated %s: %d nodes -> %d, If nodes %d -> %d",
        what, ", ".join(f"{n}={v}" for n, v in values), before[0], after[0], before[1], after[1],
    )  # fmt: skip


def deciding_scalars(graph: Any) -> list[str]:
    """Names of the scalar inputs of an onnx-ir ``graph`` whose value an ``If`` condition depends on through
    comparisons and casts only (silero's ``sr``): values worth stating per run (``epctx.session.specialize``)."""
    if not any(node.op_type == "If" for node in graph):
        return []
    consumers: dict[str, list[Any]] = {}
    for node in _ir_nodes(graph):
        for value in node.inputs:
            if value is not None and value.name:
                consumers.setdefault(value.name, []).append(node)
    found = []
    for value in graph.inputs:
        if value.const_value is not None or value.shape is None or len(value.shape) != 0:
            continue
        if _reaches_condition(value.name, consumers):
            found.append(value.name or "")
    return found


def _reaches_condition(name: str, consumers: Mapping[str, list[Any]], depth: int = 0) -> bool:
    for node in consumers.get(name, ()):
        if (
            node.op_type == "If"
            and node.inputs
            and node.inputs[0] is not None
            and node.inputs[0].name == name
        ):
            return True
        deeper = node.op_type in _CONDITION_OPS and depth < 6
        if deeper and any(_reaches_condition(o.name, consumers, depth + 1) for o in node.outputs if o.name):
            return True
    return False


def _ir_nodes(graph: Any) -> Iterator[Any]:
    for node in graph:
        yield node
        for attr in node.attributes.values():
            sub = getattr(attr, "value", None)
            if attr.type.name == "GRAPH" and sub is not None:
                yield from _ir_nodes(sub)


# -- folding -----------------------------------------------------------------------------------------------------
def _constant_name(name: str) -> str:
    return f"{name}__epctx_stated"


def _replace_uses(graph: onnx.GraphProto, name: str, new: str, value: np.ndarray) -> None:
    """Every use of ``name`` (in bodies too) reads ``new``, a Constant of ``value`` made first in ``graph``."""
    for node in _all_nodes(graph):
        for k, used in enumerate(node.input):
            if used == name:
                node.input[k] = new
    graph.node.insert(0, helper.make_node("Constant", [], [new], value=numpy_helper.from_array(value, new)))


def _all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g)


def _static_shapes(proto: onnx.ModelProto) -> dict[str, list[int]]:
    """Value name -> static shape, over the graph and its bodies (ONNX inference with data propagation)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception as exc:  # inference failed on this model: fold by constants alone
        logger.debug("shape inference for folding failed: %s", exc)
        return {}
    shapes: dict[str, list[int]] = {}
    _collect_shapes(inferred.graph, shapes)
    return shapes


def _collect_shapes(graph: onnx.GraphProto, shapes: dict[str, list[int]]) -> None:
    for info in (*graph.input, *graph.value_info, *graph.output):
        tensor = info.type.tensor_type
        if tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim):
            shapes[info.name] = [d.dim_value for d in tensor.shape.dim]
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _collect_shapes(attr.g, shapes)


def _fold_graph(
    graph: onnx.GraphProto, shapes: Mapping[str, list[int]], outer: Mapping[str, np.ndarray]
) -> bool:
    """One pass over ``graph`` (and its bodies): constants folded, decided Ifs inlined. Whether it changed."""
    known = dict(outer)
    for init in graph.initializer:
        if _elements(init.dims) <= _FOLD_ELEMENTS:
            known[init.name] = numpy_helper.to_array(init)
    changed = False
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.op_type == "Constant":
            value = _constant_value(node)
            if value is not None:
                known[node.output[0]] = value
            nodes.append(node)
            continue
        value = _folded(node, shapes, known)
        if value is not None:
            known[node.output[0]] = value
            nodes.append(_constant(node.output[0], value, node.name))
            changed = True
            continue
        branch = _decided_branch(node, known)
        if branch is not None and _inlinable(graph, branch):
            nodes.extend(_inlined(graph, node, branch))
            changed = True
            continue
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                changed |= _fold_graph(attr.g, shapes, known)
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return changed


def _folded(node: onnx.NodeProto, shapes: Mapping[str, list[int]], known: Mapping[str, np.ndarray]) -> Any:
    """The constant value of ``node``'s one output, or None."""
    if (
        len(node.output) != 1
        or node.op_type in _NOT_FOLDED
        or node.op_type.startswith(_RANDOM)
        or node.domain
    ):
        return None
    if node.op_type in ("Shape", "Size") and node.input[0] in shapes:
        shape = np.array(shapes[node.input[0]], dtype=np.int64)
        if node.op_type == "Size":
            return np.array(int(np.prod(shape)), dtype=np.int64)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        return shape[attrs.get("start", 0) : attrs.get("end", len(shape))]
    if not node.input or not all(not name or name in known for name in node.input):
        return None
    from onnx.reference import ReferenceEvaluator  # only for models with stated values

    feeds = {name: known[name] for name in node.input if name}
    graph = helper.make_graph(
        [node], "fold", [], [helper.make_tensor_value_info(node.output[0], onnx.TensorProto.UNDEFINED, None)],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in feeds.items()],
    )  # fmt: skip
    try:
        (value,) = ReferenceEvaluator(helper.make_model(graph)).run(None, {})
    except Exception as exc:  # an op the evaluator lacks or refuses: left to the runtime
        logger.debug("not folded: %s %r: %s", node.op_type, node.name, exc)
        return None
    value = np.asarray(value)
    return value if value.size <= _FOLD_ELEMENTS else None


def _decided_branch(node: onnx.NodeProto, known: Mapping[str, np.ndarray]) -> onnx.GraphProto | None:
    if node.op_type != "If" or node.domain or node.input[0] not in known:
        return None
    cond = np.asarray(known[node.input[0]])
    if cond.size != 1:
        return None
    name = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
    return next((a.g for a in node.attribute if a.name == name), None)


def _inlinable(graph: onnx.GraphProto, branch: onnx.GraphProto) -> bool:
    """A branch whose names are not already used in ``graph`` (inlined, they join its scope)."""
    names = {o for n in graph.node for o in n.output} | {i.name for i in graph.initializer}
    names |= {i.name for i in graph.input}
    mine = {o for n in branch.node for o in n.output} | {i.name for i in branch.initializer}
    return not names & mine


def _inlined(graph: onnx.GraphProto, node: onnx.NodeProto, branch: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The branch's nodes in place of the If, its initializers moved up, its outputs renamed by Identity."""
    graph.initializer.extend(branch.initializer)
    nodes = list(branch.node)
    for out, target in zip(branch.output, node.output):
        nodes.append(helper.make_node("Identity", [out.name], [target], name=f"{target}__epctx_inlined"))
    return nodes


def _drop_dead_constants(graph: onnx.GraphProto) -> None:
    """Constant nodes nothing reads any more (folded away), in the graph and its bodies."""
    used = {name for node in _all_nodes(graph) for name in node.input} | {o.name for o in graph.output}
    for sub in [graph, *(a.g for n in _all_nodes(graph) for a in n.attribute if a.type == a.GRAPH)]:
        outputs = {o.name for o in sub.output}
        keep = [
            n for n in sub.node if n.op_type != "Constant" or n.output[0] in used or n.output[0] in outputs
        ]
        if len(keep) != len(sub.node):
            del sub.node[:]
            sub.node.extend(keep)


def _constant(name: str, value: np.ndarray, node_name: str) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], value=numpy_helper.from_array(value, name), name=node_name
    )


def _constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    for attr in node.attribute:
        if attr.name == "value" and _elements(attr.t.dims) <= _FOLD_ELEMENTS:
            return numpy_helper.to_array(attr.t)
    return None


def _elements(dims: Sequence[int]) -> int:
    return int(np.prod(list(dims), dtype=np.int64)) if len(dims) else 1


def _count(graph: onnx.GraphProto, test: Any) -> int:
    return sum(1 for node in _all_nodes(graph) if test(node))
