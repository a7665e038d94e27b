"""Model loading: the full loader on top of onnx-ir (``load``), and the lean reader for context models
(``lean``), which imports neither onnx nor onnx-ir. Submodules are imported on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epctx.model.load import LoadedModel, load_model

__all__ = ["LoadedModel", "load_model"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from epctx.model import load

        return getattr(load, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
