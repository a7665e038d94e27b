"""`import onnxruntime` resolving to epctx, for the parity suite (put this folder first on PYTHONPATH)."""

import sys

import epctx
import epctx.capi.onnxruntime_pybind11_state

sys.modules["onnxruntime"] = epctx
sys.modules["onnxruntime.capi"] = epctx.capi
sys.modules["onnxruntime.capi.onnxruntime_pybind11_state"] = epctx.capi.onnxruntime_pybind11_state
