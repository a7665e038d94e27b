"""``onnx.backend.base.Backend`` adapter, so ONNX's own backend test suite runs on epctx."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, namedtupledict

from epctx.options import SessionOptions
from epctx.session import InferenceSession

__all__ = ["EpctxBackend", "EpctxBackendRep", "prepare", "run_model", "supports_device"]


class EpctxBackendRep(BackendRep):
    def __init__(self, session: InferenceSession) -> None:
        self.session = session
        self._input_names = [i.name for i in session.get_inputs()]
        self._output_names = [o.name for o in session.get_outputs()]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, dict):
            feed = dict(inputs)
        elif isinstance(inputs, (list, tuple)):
            feed = dict(zip(self._input_names, inputs))
        else:
            feed = {self._input_names[0]: inputs}
        outputs = self.session.run(None, feed)
        return namedtupledict("Outputs", self._output_names)(*outputs)


class EpctxBackend(Backend):
    providers: Sequence[str] = ("CPUExecutionProvider",)

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> EpctxBackendRep:
        options = kwargs.pop("sess_options", None) or SessionOptions()
        session = InferenceSession(model.SerializeToString(), options, providers=list(cls.providers))
        return EpctxBackendRep(session)

    @classmethod
    def run_model(
        cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
    ) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[np.dtype[Any], tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...] | None:
        raise NotImplementedError("epctx runs models, not single nodes: use run_model")

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() == "CPU"


prepare = EpctxBackend.prepare
run_model = EpctxBackend.run_model
supports_device = EpctxBackend.supports_device
