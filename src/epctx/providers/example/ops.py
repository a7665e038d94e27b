"""The ops the example EP runs (no imports: the provider's options list them at import time)."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["SUPPORTED_OPS"]

# op type (default domain) -> (first opset whose semantics we implement, min inputs, max inputs)
SUPPORTED_OPS: Mapping[str, tuple[int, int, int]] = {
    "MatMul": (1, 2, 2),
    "Gemm": (7, 2, 3),
    "Add": (7, 2, 2),
    "Sub": (7, 2, 2),
    "Mul": (7, 2, 2),
    "Div": (7, 2, 2),
    "Relu": (6, 1, 1),
    "Sigmoid": (6, 1, 1),
    "Tanh": (6, 1, 1),
    "Softmax": (13, 1, 1),
    "Reshape": (5, 2, 2),
    "Transpose": (1, 1, 1),
    "Identity": (1, 1, 1),
}
