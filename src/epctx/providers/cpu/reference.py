"""The long tail: ops without an own kernel run onnx.reference's per-op implementation."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator
from onnx.reference import op_run
from onnx.reference.ops import load_op

from epctx.errors import NotImplemented
from epctx.providers.base import Kernel
from epctx.providers.cpu.registry import NodeInfo

__all__ = ["reference_kernel"]


def _noop_log(*args: Any) -> None:
    return None


def reference_kernel(info: NodeInfo) -> Kernel:
    """Wrap onnx.reference's implementation of ``info``'s op. Raises NotImplemented if it has none."""
    proto = ir.serde.serialize_node(info.node)
    domain = info.domain
    run_params = {
        "log": _noop_log,
        "opsets": {domain: info.opset, "": info.opset if domain == "" else 21},
        "verbose": 0,
        "new_ops": {},
        "existing_functions": {},
        "evaluator_cls": ReferenceEvaluator,
    }
    try:
        cls = load_op(domain, info.op_type, info.opset, node=proto, evaluator_cls=ReferenceEvaluator)
    except op_run.RuntimeContextError:
        return _ContextDependent(info, proto, run_params)
    except Exception as exc:
        raise NotImplemented(
            f"no CPU kernel for op {info.op_type!r} (domain {domain or 'ai.onnx'!r}, opset {info.opset}) "
            f"of node {info.name!r}: {exc}"
        ) from exc
    impl = cls(proto, run_params)
    run = impl.run

    def call(*inputs: Any) -> Any:
        return run(*inputs)

    return call


class _ContextDependent:
    """Ops whose reference implementation depends on input types: instantiated per input dtype set."""

    def __init__(self, info: NodeInfo, proto: onnx.NodeProto, run_params: dict[str, Any]) -> None:
        self._info = info
        self._proto = proto
        self._params = run_params
        self._cache: dict[tuple[Any, ...], Any] = {}

    def __call__(self, *inputs: Any) -> Any:
        key = tuple(getattr(x, "dtype", None) for x in inputs)
        impl = self._cache.get(key)
        if impl is None:
            types = [
                onnx.helper.make_tensor_type_proto(onnx.helper.np_dtype_to_tensor_dtype(np.asarray(x).dtype), None)
                for x in inputs
                if x is not None
            ]
            cls = load_op(
                self._info.domain,
                self._info.op_type,
                self._info.opset,
                node=self._proto,
                input_types=types,
                evaluator_cls=ReferenceEvaluator,
            )
            impl = self._cache[key] = cls(self._proto, self._params)
        return impl.run(*inputs)


def has_reference(node: ir.Node, opset: int) -> bool:
    """True when onnx.reference implements ``node``'s op at ``opset``."""
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    try:
        load_op(domain, node.op_type, opset, evaluator_cls=ReferenceEvaluator)
    except op_run.RuntimeContextError:
        return True
    except Exception:
        return False
    return True
