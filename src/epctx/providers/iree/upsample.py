"""Nearest-neighbour upsampling by whole factors as a broadcast, rewritten in the ONNX graph before IREE imports it
(in the compile worker, with ``onnx`` only).

A detector's neck doubles a feature map with ``Resize`` (mode ``nearest``: PyTorch's ``nn.Upsample``, YOLO's
FPN). IREE lowers it as a gather whose every element computes its source index in floating point (divisions,
``floor``, clamps): the corpus' YOLO, 1x128x20x20 -> 40x40, 354 us, and the two of its run 0.53 ms of 13. With a
whole factor the result is each pixel repeated, ``Expand`` of the input with a unit axis after each spatial one,
then a ``Reshape``: a broadcast IREE copies at memory speed.

Exact for the coordinate modes where output pixel ``i`` reads input pixel ``floor(i / s)``: ``asymmetric`` with
``nearest_mode`` ``round_prefer_floor`` (ONNX's default) or ``floor``; ``half_pixel`` / ``pytorch_half_pixel``
with ``round_prefer_floor`` or ``round_prefer_ceil`` (no ties there). Others are left to IREE."""

from __future__ import annotations

from typing import Any

__all__ = ["nearest_upsamples_as_broadcasts"]

_FLOOR_MODES = {
    "asymmetric": ("round_prefer_floor", "floor"),
    "half_pixel": ("round_prefer_floor", "round_prefer_ceil"),
    "pytorch_half_pixel": ("round_prefer_floor", "round_prefer_ceil"),
}


def _text(node: Any, name: str, default: str) -> str:
    from onnx import helper

    found = next((a for a in node.attribute if a.name == name), None)
    value = default if found is None else helper.get_attribute_value(found)
    return value.decode() if isinstance(value, bytes) else str(value)


def _factors(
    node: Any, initializers: dict[str, Any], shape: list[int | None] | None
) -> tuple[int, int] | None:
    """The whole (height, width) factors of a 4-D nearest ``Resize`` this rewrite handles, or None."""
    from onnx import numpy_helper

    if node.op_type != "Resize" or node.domain not in ("", "ai.onnx") or len(node.input) < 3:
        return None
    if _text(node, "mode", "nearest") != "nearest" or shape is None or len(shape) != 4:
        return None
    mode = _text(node, "coordinate_transformation_mode", "half_pixel")
    if _text(node, "nearest_mode", "round_prefer_floor") not in _FLOOR_MODES.get(mode, ()):
        return None
    if (len(node.input) > 3 and node.input[3]) or node.input[
        2
    ] not in initializers:  # sizes, or scales not known
        return None
    scales = [float(s) for s in numpy_helper.to_array(initializers[node.input[2]]).ravel()]
    if len(scales) != 4 or scales[:2] != [1.0, 1.0] or any(s < 1 or s != int(s) for s in scales[2:]):
        return None
    _, _, h, w = shape
    if not isinstance(h, int) or not isinstance(w, int) or not (h and w) or scales[2:] == [1.0, 1.0]:
        return None
    return int(scales[2]), int(scales[3])


def nearest_upsamples_as_broadcasts(model: Any) -> int:
    """Rewrite each nearest ``Resize`` of ``model`` (an onnx ModelProto) that ``_factors`` accepts as ``Unsqueeze``,
    ``Expand``, ``Reshape``; returns how many."""
    import numpy as np
    from onnx import helper, numpy_helper

    from epctx.providers.iree.node_rewrites import Replacement, rewrite_nodes, value_shapes

    shapes = value_shapes(model)
    initializers = {t.name: t for t in model.graph.initializer}

    def replace(k: int, node: Any) -> Replacement | None:
        factors = _factors(node, initializers, shapes.get(node.input[0]))
        if factors is None:
            return None
        (fh, fw), (_, _, h, w) = factors, shapes[node.input[0]]
        name = f"epctx_up{k}"
        consts = [
            numpy_helper.from_array(np.array([3, 5], np.int64), f"{name}_axes"),
            numpy_helper.from_array(np.array([1, 1, 1, fh, 1, fw], np.int64), f"{name}_times"),
            numpy_helper.from_array(np.array([0, 0, int(h or 0) * fh, int(w or 0) * fw], np.int64), f"{name}_shape"),
        ]  # fmt: skip
        nodes = [
            helper.make_node("Unsqueeze", [node.input[0], f"{name}_axes"], [f"{name}_6d"]),
            helper.make_node("Expand", [f"{name}_6d", f"{name}_times"], [f"{name}_wide"]),
            helper.make_node("Reshape", [f"{name}_wide", f"{name}_shape"], list(node.output), name=node.name),
        ]
        return nodes, consts

    return rewrite_nodes(model, replace)
