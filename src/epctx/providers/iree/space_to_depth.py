"""Strided stems as stride-1 convolutions over the space-to-depth of their input, rewritten in the ONNX graph before
IREE imports it (in the compile worker, with ``onnx`` only).

A network's first convolution reads an image of three channels with a stride of 2 (ResNet's 7x7, the 3x3 of
YOLO and MobileNet stems). IREE's data tiling of convolutions (``options.CONV_DATA_TILING``), which makes the
other convolutions of a net two to three times faster, makes that one slower: its reduction is 3 channels deep
per tap, and the strided input is packed first. ResNet-18's stem at 224x224, one thread: 1.5 ms untiled,
7.9 ms tiled plus 1.2 ms packing its input; rewritten, 2.9 ms tiled plus 0.4 ms for the space-to-depth.

The rewrite: ``y = conv(x, w, stride 2)`` with a ``kh x kw`` filter over ``C`` channels equals
``conv(s2d(pad(x)), w', stride 1)`` where ``s2d`` moves each 2x2 block of pixels into ``4C`` channels and ``w'``
is the filter zero-padded to an even size and rearranged alike (``ceil(kh/2) x ceil(kw/2)`` over ``4C``
channels). The input's rearrangement is a reshape and a transpose IREE fuses with its layout change; the filter's
is computed by the module from the stored parameter when it loads (a few kilobytes: the stem's filter)."""

from __future__ import annotations

from typing import Any

from epctx.providers.iree.node_rewrites import Replacement, rewrite_nodes, value_shapes

__all__ = ["MAX_CHANNELS", "strided_stems_to_depth", "value_shapes"]

MAX_CHANNELS = 4  # input channels of the convolutions rewritten (an image's 1, 3 or 4)


def _attr(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else helper.get_attribute_value(found)


def _stem(node: Any, initializers: dict[str, Any], shapes: dict[str, list[int | None]]) -> list[int] | None:
    """``[C, H, W, kh, kw, O]`` of a 2-D Conv this rewrite handles (stride 2, no dilation, one group, explicit or no
    padding, at most ``MAX_CHANNELS`` input channels, filter an initializer, input's C, H, W known), or None."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    weight = initializers.get(node.input[1])
    shape = shapes.get(node.input[0])
    if weight is None or len(weight.dims) != 4 or shape is None or len(shape) != 4:
        return None
    out, channels, kh, kw = (int(d) for d in weight.dims)
    if (
        channels > MAX_CHANNELS
        or _attr(node, "group", 1) != 1
        or list(_attr(node, "strides", [1, 1])) != [2, 2]
    ):
        return None
    if list(_attr(node, "dilations", [1, 1])) != [1, 1] or _attr(node, "auto_pad", "NOTSET") not in (
        b"NOTSET",
        "NOTSET",
    ):
        return None
    _, c, h, w = shape
    if c != channels or not isinstance(h, int) or not isinstance(w, int) or not (h and w):
        return None
    return [channels, h, w, kh, kw, out]


def _nodes(node: Any, dims: list[int], name: str) -> tuple[list[Any], list[Any]]:
    """The nodes and constants of ``node`` rewritten (``dims`` from ``_stem``)."""
    import numpy as np
    from onnx import helper, numpy_helper

    channels, h, w, kh, kw, out = dims
    pads = [int(p) for p in _attr(node, "pads", [0, 0, 0, 0])]
    ka, kb = (kh + 1) // 2, (kw + 1) // 2  # the kernel over the space-to-depth
    ho, wo = (h + pads[0] + pads[2] - kh) // 2 + 1, (w + pads[1] + pads[3] - kw) // 2 + 1
    hp, wp = 2 * (ho - 1 + ka), 2 * (wo - 1 + kb)  # the padded input's rows and columns read
    consts: list[Any] = []

    def const(values: list[int], suffix: str) -> str:
        consts.append(numpy_helper.from_array(np.array(values, np.int64), f"{name}_k{suffix}"))
        return f"{name}_k{suffix}"

    below, right = hp - h - pads[0], wp - w - pads[1]  # negative: rows past the last one read are cropped
    nodes = [helper.make_node("Pad", [node.input[0], const([0, 0, pads[0], pads[1], 0, 0, max(below, 0),
                                                                 max(right, 0)], "pads")], [f"{name}_xp"])]  # fmt: skip
    source = f"{name}_xp"
    if below < 0 or right < 0:
        ends = const([hp, wp], "ends")
        nodes.append(helper.make_node("Slice", [source, const([0, 0], "starts"), ends, const([2, 3], "axes")],
                                      [f"{name}_xc"]))  # fmt: skip
        source = f"{name}_xc"
    nodes += [
        helper.make_node("Reshape", [source, const([-1, channels, hp // 2, 2, wp // 2, 2], "x6")], [f"{name}_x6"]),
        helper.make_node("Transpose", [f"{name}_x6"], [f"{name}_x6t"], perm=[0, 1, 3, 5, 2, 4]),
        helper.make_node("Reshape", [f"{name}_x6t", const([-1, 4 * channels, hp // 2, wp // 2], "x4")], [f"{name}_x"]),
        # the filter alike: zero-padded to 2ka x 2kb, each 2x2 block of taps into 4C channels
        helper.make_node("Pad", [node.input[1], const([0, 0, 0, 0, 0, 0, 2 * ka - kh, 2 * kb - kw], "wpads")],
                         [f"{name}_wp"]),
        helper.make_node("Reshape", [f"{name}_wp", const([out, channels, ka, 2, kb, 2], "w6")], [f"{name}_w6"]),
        helper.make_node("Transpose", [f"{name}_w6"], [f"{name}_w6t"], perm=[0, 1, 3, 5, 2, 4]),
        helper.make_node("Reshape", [f"{name}_w6t", const([out, 4 * channels, ka, kb], "w4")], [f"{name}_w"]),
        helper.make_node("Conv", [f"{name}_x", f"{name}_w", *node.input[2:]], list(node.output),
                         kernel_shape=[ka, kb], name=node.name),
    ]  # fmt: skip
    return nodes, consts


def strided_stems_to_depth(model: Any) -> int:
    """Rewrite each strided stem of ``model`` (an onnx ModelProto; see ``_stem``) in place; returns how many."""
    shapes = value_shapes(model)
    initializers = {t.name: t for t in model.graph.initializer}

    def replace(k: int, node: Any) -> Replacement | None:
        dims = _stem(node, initializers, shapes)
        return None if dims is None else _nodes(node, dims, f"epctx_s2d{k}")

    return rewrite_nodes(model, replace)
