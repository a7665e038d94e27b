"""Graph optimizations applied at session creation (``SessionOptions.graph_optimization_level``)."""

from epctx.optimize.fold_batchnorm import fold_conv_batchnorm

__all__ = ["fold_conv_batchnorm"]
