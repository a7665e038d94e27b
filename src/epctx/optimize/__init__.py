"""Graph optimizations applied at session creation (``SessionOptions.graph_optimization_level``)."""

from epctx.optimize.fold_batchnorm import fold_batchnorms
from epctx.optimize.fold_conv import fold_conv_affine, fold_conv_batchnorm, fold_scales_and_shifts

__all__ = ["fold_batchnorms", "fold_conv_affine", "fold_conv_batchnorm", "fold_scales_and_shifts"]
