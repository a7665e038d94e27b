"""Which module of ``epctx.providers.cpu.kernels`` holds the kernel of each op (default domain): the CPU EP
imports a kernel module when a node of one of its ops is first asked about, never the whole table.
``tests/cpu/test_kernel_index.py`` checks this index against what the modules register."""

from __future__ import annotations

__all__ = ["KERNEL_MODULES", "MS_KERNEL_MODULES", "module_for"]

KERNEL_MODULES: dict[str, tuple[str, ...]] = {
    "cast": ("Cast", "CastLike"),
    "control_flow": ("If", "Loop", "Scan"),
    "conv": ("Conv",),
    "conv_transpose": ("ConvTranspose",),
    "elementwise": (
        "Abs",
        "Acos",
        "Acosh",
        "Add",
        "And",
        "Asin",
        "Asinh",
        "Atan",
        "Atanh",
        "BitShift",
        "BitwiseAnd",
        "BitwiseNot",
        "BitwiseOr",
        "BitwiseXor",
        "Ceil",
        "Celu",
        "Clip",
        "Cos",
        "Cosh",
        "Div",
        "Elu",
        "Equal",
        "Erf",
        "Exp",
        "Floor",
        "Gelu",
        "Greater",
        "GreaterOrEqual",
        "HardSigmoid",
        "HardSwish",
        "Identity",
        "IsInf",
        "IsNaN",
        "LeakyRelu",
        "Less",
        "LessOrEqual",
        "Log",
        "Max",
        "Mean",
        "Min",
        "Mish",
        "Mod",
        "Mul",
        "Neg",
        "Not",
        "Or",
        "PRelu",
        "Pow",
        "Reciprocal",
        "Relu",
        "Round",
        "Selu",
        "Shrink",
        "Sigmoid",
        "Sign",
        "Sin",
        "Sinh",
        "Softplus",
        "Softsign",
        "Sqrt",
        "Sub",
        "Sum",
        "Tan",
        "Tanh",
        "ThresholdedRelu",
        "Where",
        "Xor",
    ),
    "linalg": ("Einsum", "Gemm", "Hardmax", "LogSoftmax", "MatMul", "Softmax"),
    "normalization": (
        "BatchNormalization",
        "GroupNormalization",
        "InstanceNormalization",
        "LayerNormalization",
        "LpNormalization",
    ),
    "pool": ("AveragePool", "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool", "LpPool", "MaxPool"),
    "quant": (
        "ConvInteger",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "MatMulInteger",
        "QLinearConv",
        "QLinearMatMul",
        "QuantizeLinear",
    ),
    "reduce": (
        "ArgMax",
        "ArgMin",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceMax",
        "ReduceMean",
        "ReduceMin",
        "ReduceProd",
        "ReduceSum",
        "ReduceSumSquare",
    ),
    "pad": ("Pad",),
    "signal": ("STFT",),
    "resize": ("Resize", "Upsample"),
    "rnn": ("GRU", "LSTM", "RNN"),
    "tensor": (
        "Concat",
        "Constant",
        "ConstantOfShape",
        "CumSum",
        "DepthToSpace",
        "Expand",
        "Flatten",
        "Gather",
        "GatherElements",
        "GatherND",
        "NonZero",
        "OneHot",
        "Range",
        "Reshape",
        "Scatter",
        "ScatterElements",
        "ScatterND",
        "Shape",
        "Size",
        "Slice",
        "SpaceToDepth",
        "Split",
        "Squeeze",
        "Tile",
        "TopK",
        "Transpose",
        "Trilu",
        "Unsqueeze",
    ),
}

_MODULE_OF = {op: module for module, ops in KERNEL_MODULES.items() for op in ops}


# onnxruntime's own ops (domain com.microsoft) the CPU EP has kernels for
MS_KERNEL_MODULES: dict[str, tuple[str, ...]] = {"quant_rnn": ("DynamicQuantizeLSTM",)}
_MS_MODULE_OF = {op: module for module, ops in MS_KERNEL_MODULES.items() for op in ops}


def module_for(domain: str, op_type: str) -> str | None:
    """The full name of the kernel module for ``op_type`` in ``domain`` ("" or "ai.onnx", or "com.microsoft"),
    None if none."""
    if domain == "com.microsoft":
        module = _MS_MODULE_OF.get(op_type)
        return None if module is None else f"epctx.providers.cpu.kernels.{module}"
    if domain not in ("", "ai.onnx"):
        return None
    module = _MODULE_OF.get(op_type)
    return None if module is None else f"epctx.providers.cpu.kernels.{module}"
