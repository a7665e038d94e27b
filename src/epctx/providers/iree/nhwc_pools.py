"""Global average pools over channels-last data, rewritten in the ONNX graph before IREE imports it (in the compile
worker, with ``onnx`` only), for jobs compiled channels-last.

A squeeze-and-excitation block (MobileNetV3, PP-OCR's classifier) pools the output of a depthwise convolution and
scales that same output by the result. With the convolutions channels-last, that output is NHWC, but ONNX's
``GlobalAveragePool`` reads NCHW: the value has two consumers wanting two layouts, and IREE materialises the
NCHW copy in a transposing element-wise dispatch that is slow (strided writes): MobileNetV3 at 224x224, one
thread, 1.24 ms of a 4.18 ms run in eight such dispatches. Written as a ``ReduceMean`` over the NHWC
transpose of its input, reshaped to ``(N, C, 1, 1)`` (the same bytes), the transposes cancel with those of the
convolutions: 0.15 ms in those dispatches, 3.02 ms a run, results 1.2e-7 from onnxruntime."""

from __future__ import annotations

from typing import Any

__all__ = ["global_pools_channels_last"]


def global_pools_channels_last(model: Any) -> int:
    """Rewrite each ``GlobalAveragePool`` of ``model`` (an onnx ModelProto) over a value of rank 4 as a
    ``ReduceMean`` over the NHWC transpose of its input, reshaped back to NCHW's ``(N, C, 1, 1)``; returns how
    many."""
    import numpy as np
    from onnx import helper, numpy_helper

    from epctx.providers.iree.node_rewrites import Replacement, rewrite_nodes, value_shapes

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    shapes = value_shapes(model)

    def replace(k: int, node: Any) -> Replacement | None:
        shape = shapes.get(node.input[0]) if node.op_type == "GlobalAveragePool" else None
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
