"""Steps of session creation that need nothing of the session: whether a context model may take the lean path,
the ORT_PARALLEL warning, writing the optimized model (``optimized_model_filepath``)."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from epctx import options as opt
from epctx._warnings import warn_and_log
from epctx.errors import InvalidArgument

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["lean_allowed", "warn_sequential", "write_optimized_model"]

logger = logging.getLogger("epctx")


def warn_sequential(options: opt.SessionOptions) -> None:
    """epctx runs plan steps one after the other: ORT_PARALLEL is said, not silently ignored (onnxruntime uses
    inter_op_num_threads in that mode only)."""
    if options.execution_mode == opt.ExecutionMode.ORT_PARALLEL:
        message = (
            "epctx runs the plan's steps sequentially: execution_mode=ORT_PARALLEL / inter_op_num_threads="
            f"{options.inter_op_num_threads} have no effect (intra_op_num_threads sets each EP's threads)"
        )
        warn_and_log(logger, message)


def write_optimized_model(model: ir.Model, path: str | os.PathLike[str]) -> None:
    """``optimized_model_filepath``: the model after epctx's graph passes, before partitioning (ONNX format)."""
    target = os.fspath(path)
    if target.lower().endswith(".ort"):
        raise InvalidArgument(
            f"optimized_model_filepath {target!r}: epctx writes ONNX models only, not onnxruntime's ORT format"
        )
    import onnx_ir as ir

    ir.save(model, target)
    logger.info("wrote the optimized model %s", target)


def lean_allowed(options: opt.SessionOptions, config: opt.SessionConfig) -> bool:
    """Whether a context model may take the lean path: nothing asked of the session needs the model's graph
    (generating a context model, writing the optimized model, stating shapes, overriding dimensions or
    initializers)."""
    by_name, by_denotation = options.free_dimension_overrides
    return not (
        config.ep_context_enable
        or config.input_shapes
        or config.input_values
        or options.optimized_model_filepath
        or by_name
        or by_denotation
        or options.initializers
    )
