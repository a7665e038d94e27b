"""Load-time type and shape checking, as onnxruntime does: ONNX type inference over the whole model.

onnxruntime resolves every graph at load with each operator's type and shape inference and refuses a model
whose types do not agree (a Conv with float64 weights and a float32 input, a node whose output is declared
with another element type, an Add of incompatible shapes). epctx runs ONNX's inference once per load, in
strict mode, on the model without its weights' payload, and refuses the same models with ONNX's message.

onnxruntime is lenient in one case: a shape declared for a value (``value_info``, a graph output) that
differs from the inferred one is a warning ("Falling back to lenient merge"). Such conflicts are warned about
here too, and the types then come from a non-strict inference; so are errors ONNX finds inside the function
body it expands for a function op (its own limits, e.g. MeanVarianceNormalization). Operators ONNX does not
know (custom domains, ``com.microsoft``) are skipped by ONNX's inference, so they are not refused here.
"""

from __future__ import annotations

import logging

import onnx

from epctx.errors import Fail

__all__ = ["check_types"]

logger = logging.getLogger("epctx")

# Inference errors onnxruntime does not refuse a model for: a declared shape that differs from the inferred
# one (it merges the shapes leniently), and an error inside the function body ONNX expands for a function op
# (e.g. MeanVarianceNormalization's Constant with a referenced attribute): onnxruntime runs its own kernel.
_LENIENT = ("Inferred shape and existing shape differ", "Inference error(s):")


def check_types(model: bytes, what: str) -> onnx.ModelProto | None:
    """The model with inferred types (for the EPs), or Fail with ONNX's message when its types do not agree.
    None when the inference could not run at all (a model ONNX cannot infer for a reason other than types)."""
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except onnx.shape_inference.InferenceError as exc:
        errors = _errors(str(exc))
        if not all(any(marker in line for marker in _LENIENT) for line in errors):
            raise Fail(
                f"{what} failed type and shape inference (onnxruntime refuses it at load): "
                + "; ".join(errors)
            ) from exc
        logger.warning("%s: ONNX type inference (not refused, as onnxruntime): %s", what, "; ".join(errors))
    except Exception as exc:  # ONNX's inference broke on the model itself, not on its types
        logger.debug("type inference could not run on %s: %s", what, exc)
        return None
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=True)
    except Exception as exc:
        logger.debug("type inference could not run on %s: %s", what, exc)
        return None


def _errors(message: str) -> list[str]:
    """One entry per node error of ONNX's message ("Inference error(s): (op_type:.., node name: ..): ...")."""
    lines = [line.strip() for line in message.splitlines() if "(op_type:" in line]
    if not lines:
        return [message.strip()]
    first = lines[0]
    start = first.find("(op_type:")
    return [first[start:], *lines[1:]]
