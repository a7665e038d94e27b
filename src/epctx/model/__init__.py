"""Model loading and saving on top of onnx-ir."""

from epctx.model.load import LoadedModel, load_model

__all__ = ["LoadedModel", "load_model"]
