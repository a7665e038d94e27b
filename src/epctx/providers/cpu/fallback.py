"""The onnx.reference fallback as kernel modules call it: onnx.reference is imported when a kernel first needs
it (a Cast to a type numpy lacks, a LayerNormalization variant...), not when the kernel module loads."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epctx.ep import Kernel
    from epctx.providers.cpu.registry import NodeInfo

__all__ = ["reference_kernel"]


def reference_kernel(info: NodeInfo) -> Kernel:
    """onnx.reference's implementation of ``info``'s op (see :mod:`epctx.providers.cpu.reference`)."""
    from epctx.providers.cpu.reference import reference_kernel as build

    return build(info)
