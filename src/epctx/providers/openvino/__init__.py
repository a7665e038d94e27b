"""The OpenVINO execution provider (the ``openvino`` package; imported only when the EP is selected)."""

from epctx.providers.openvino.provider import OpenVINOExecutionProvider

__all__ = ["OpenVINOExecutionProvider"]
