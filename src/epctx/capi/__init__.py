"""onnxruntime's module paths where its users import from them: ``epctx.capi.onnxruntime_pybind11_state``."""

from epctx.capi import onnxruntime_pybind11_state

__all__ = ["onnxruntime_pybind11_state"]
