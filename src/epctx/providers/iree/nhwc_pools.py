"""Global average pools over channels-last data, rewritten in the ONNX graph before IREE imports it (in the compile
worker, with ``onnx`` only), for jobs compiled channels-last.

A squeeze-and-excitation block (MobileNetV3, PP-OCR's classifier) pools the output of a depthwise convolution and
scales that same output by the result. With the convolutions channels-last, that output is NHWC, but ONNX's
``GlobalAveragePool`` reads NCHW: the value has two consumers wanting two layouts, and IREE materialises the
NCHW copy in a transposing element-wise dispatch that is slow (strided writes): MobileNetV3 at 224x224, one
thread, 1.24 ms of a 4.18 ms run in eight such dispatches. Written as a ``ReduceMean`` over the NHWC
transpose of its input, reshaped to ``(N, C, 1, 1)`` (the same bytes), the transposes cancel with those of the
convolutions: 0.15 ms in those dispatches, 3.02 ms a run, results 1.2e-7 from onnxruntime.

A ``MaxPool`` between channels-last convolutions (ResNet's after its stem, the SPPF block of YOLO detectors) reads
NHWC data but IREE computes it in NCHW order, vectorised along a strided width, then transposes it back: ResNet-18's
3x3 / 2 pool over 112x112x64 took 1.6-1.8 ms of a 31 ms run (onnxruntime: 0.14 ms). Written as the maximum over the
kernel's taps of strided slices of the NHWC transpose of its input (padded with -inf), IREE fuses it into one
element-wise loop nest over contiguous channels."""

from __future__ import annotations

from typing import Any

__all__ = ["POOLS", "global_pools_channels_last"]

# the element types of the max pools rewritten (onnx.TensorProto codes) -> numpy's, for the padding's -inf
_FLOATS = {1: "float32", 10: "float16", 11: "float64"}
# A max pool of more taps than this is taken as the maximum over its rows of the maximum over its columns (two
# element-wise loops of kh and kw taps): the SPP block of a YOLOX detector (ddddocr's) pools 192 channels of 13x13
# with 9x9 and 13x13 kernels, which IREE ran as NCHW pooling, 1.5 and 3.3 ms of a 57 ms run; smaller ones stay
# one loop over all taps (ResNet-18's 3x3, a YOLO's 5x5 SPPF: measured as such, 1.69 -> 1.53x onnxruntime)
_MAX_FUSED_TAPS = 49
_MAX_SEPARABLE_TAPS = 50  # rows + columns
# the ops rewritten (compile.py asks for the rewrite where they are)
POOLS = frozenset({"GlobalAveragePool", "MaxPool"})


def _attr(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else helper.get_attribute_value(found)


def _max_pool_dims(
    node: Any, shape: list[int | None] | None
) -> tuple[list[int], list[int], list[int]] | None:
    """``(kernel, strides, pads)`` of a 2-D MaxPool this rewrite handles (one output, no dilation, floor mode,
    explicit or no padding, its input's shape known), or None. Not with a dynamic batch: IREE's channels-last
    conversion fails on a MaxPool so, and the EP's fallback for that (``CONV_TILING_FALLBACK``) is what runs those
    nets (the corpus' ResNet-18 as shipped), measured against IREE's channels-last code, not this."""
    if node.op_type != "MaxPool" or len(node.output) != 1 or shape is None or len(shape) != 4:
        return None
    if not all(isinstance(d, int) and d for d in shape):  # static: a dynamic batch keeps IREE's own path
        return None
    kernel = list(_attr(node, "kernel_shape", []))
    dilations = list(_attr(node, "dilations", [1, 1]))
    if (
        len(kernel) != 2
        or dilations != [1, 1]
        or _attr(node, "ceil_mode", 0) != 0
        or kernel[0] + kernel[1] > _MAX_SEPARABLE_TAPS
    ):
        return None
    if _attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
        return None
    if _attr(node, "storage_order", 0) != 0:
        return None
    return kernel, list(_attr(node, "strides", [1, 1])), list(_attr(node, "pads", [0, 0, 0, 0]))


def _max_pool(
    node: Any, shape: list[int], dims: tuple[list[int], list[int], list[int]], dtype: Any, name: str
) -> Any:
    """The nodes and constants of a MaxPool as the maximum of strided slices of its NHWC input, padded with
    ``dtype``'s -inf: of all its taps' slices, or past ``_MAX_FUSED_TAPS`` of its rows' then of its columns'."""
    import numpy as np
    from onnx import helper, numpy_helper

    (kh, kw), strides, pads = dims
    h, w = shape[2] + pads[0] + pads[2], shape[3] + pads[1] + pads[3]
    ho, wo = (h - kh) // strides[0] + 1, (w - kw) // strides[1] + 1
    consts = [
        numpy_helper.from_array(np.array([1, 2], np.int64), f"{name}_axes"),
        numpy_helper.from_array(np.array(strides, np.int64), f"{name}_steps"),
    ]
    nodes = [helper.make_node("Transpose", [node.input[0]], [f"{name}_nhwc"], perm=[0, 2, 3, 1])]
    source = f"{name}_nhwc"
    if any(pads):
        consts += [
            numpy_helper.from_array(np.array([0, pads[0], pads[1], 0, 0, pads[2], pads[3], 0], np.int64),
                                    f"{name}_pads"),
            numpy_helper.from_array(np.array(-np.inf, dtype), f"{name}_low"),
        ]  # fmt: skip
        nodes.append(helper.make_node("Pad", [source, f"{name}_pads", f"{name}_low"], [f"{name}_padded"]))
        source = f"{name}_padded"
    if kh * kw <= _MAX_FUSED_TAPS:
        taps = [([i, j], [i + strides[0] * (ho - 1) + 1, j + strides[1] * (wo - 1) + 1]) for i in range(kh)
                for j in range(kw)]  # fmt: skip
        total = _max_of_slices(nodes, consts, source, taps, f"{name}_axes", f"{name}_steps", name)
    else:  # the rows' maximum first (every column), then the columns'
        consts += [numpy_helper.from_array(np.array([a], np.int64), f"{name}_{tag}")
                   for a, tag in ((1, "hax"), (2, "wax"), (strides[0], "hst"), (strides[1], "wst"))]  # fmt: skip
        rows = [([i], [i + strides[0] * (ho - 1) + 1]) for i in range(kh)]
        source = _max_of_slices(nodes, consts, source, rows, f"{name}_hax", f"{name}_hst", f"{name}_r")
        cols = [([j], [j + strides[1] * (wo - 1) + 1]) for j in range(kw)]
        total = _max_of_slices(nodes, consts, source, cols, f"{name}_wax", f"{name}_wst", f"{name}_c")
    nodes.append(helper.make_node("Transpose", [total], list(node.output), perm=[0, 3, 1, 2], name=node.name))
    return nodes, consts


def _max_of_slices(
    nodes: list[Any], consts: list[Any], source: str, taps: list[tuple[list[int], list[int]]], axes: str,
    steps: str, name: str,
) -> str:  # fmt: skip
    """Append the Slice of ``source`` for each tap (its starts, its ends) and the Max chain over them; the name of
    the result."""
    import numpy as np
    from onnx import helper, numpy_helper

    total = ""
    for k, (starts, ends) in enumerate(taps):
        tap = f"{name}_{k}"
        consts += [numpy_helper.from_array(np.array(starts, np.int64), f"{tap}_s"),
                   numpy_helper.from_array(np.array(ends, np.int64), f"{tap}_e")]  # fmt: skip
        nodes.append(helper.make_node("Slice", [source, f"{tap}_s", f"{tap}_e", axes, steps], [f"{tap}_x"]))
        if total:
            nodes.append(helper.make_node("Max", [total, f"{tap}_x"], [f"{tap}_m"]))
            total = f"{tap}_m"
        else:
            total = f"{tap}_x"
    return total


def global_pools_channels_last(model: Any) -> int:
    """Rewrite each ``GlobalAveragePool`` of ``model`` (an onnx ModelProto) over a value of rank 4 as a
    ``ReduceMean`` over the NHWC transpose of its input, reshaped back to NCHW's ``(N, C, 1, 1)``, and each 2-D
    ``MaxPool`` (see ``_max_pool_dims``) as the maximum of strided slices of that transpose; returns how many."""
    import numpy as np
    from onnx import helper, numpy_helper

    from epctx.providers.iree.node_rewrites import Replacement, rewrite_nodes, value_types

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    shapes, types = value_types(model)

    def replace(k: int, node: Any) -> Replacement | None:
        if node.domain not in ("", "ai.onnx") or node.op_type not in POOLS:
            return None
        if node.op_type == "MaxPool":
            dims = _max_pool_dims(node, shapes.get(node.input[0]))
            dtype = _FLOATS.get(types.get(node.input[0], 0))
            if dims is None or dtype is None:
                return None
            return _max_pool(node, shapes[node.input[0]], dims, dtype, f"epctx_mp{k}")  # type: ignore[arg-type]
        shape = shapes.get(node.input[0])
        if shape is None or len(shape) != 4 or node.domain not in ("", "ai.onnx"):
            return None
        name = f"epctx_gap{k}"
        consts = [numpy_helper.from_array(np.array([0, -1, 1, 1], np.int64), f"{name}_nchw")]
        if opset >= 18:  # the axes an input
            consts.append(numpy_helper.from_array(np.array([1, 2], np.int64), f"{name}_axes"))
            mean = helper.make_node(
                "ReduceMean", [f"{name}_nhwc", f"{name}_axes"], [f"{name}_mean"], keepdims=1
            )
        else:
            mean = helper.make_node("ReduceMean", [f"{name}_nhwc"], [f"{name}_mean"], axes=[1, 2], keepdims=1)
        nodes = [
            helper.make_node("Transpose", [node.input[0]], [f"{name}_nhwc"], perm=[0, 2, 3, 1]),
            mean,
            helper.make_node("Reshape", [f"{name}_mean", f"{name}_nchw"], list(node.output), name=node.name),
        ]
        return nodes, consts

    return rewrite_nodes(model, replace)
