"""Graph optimizations applied at session creation (``SessionOptions.graph_optimization_level``)."""

from epctx.optimize.fold_conv import fold_conv_affine

__all__ = ["fold_conv_affine"]
