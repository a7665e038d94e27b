"""The long tail: ops without an own kernel run onnx.reference's per-op implementation."""

from __future__ import annotations

import importlib
import locale
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator, op_run

from epctx.ep import Kernel
from epctx.providers.cpu.registry import NodeInfo

__all__ = ["has_reference", "reference_kernel"]

# Non-default domains that onnx.reference implements, and the module holding each one's loader.
_DOMAIN_MODULES = {
    "ai.onnx.ml": "onnx.reference.ops.aionnxml",
    "ai.onnx.preview": "onnx.reference.ops.aionnx_preview",
    "ai.onnx.preview.training": "onnx.reference.ops.aionnx_preview_training",
    "experimental": "onnx.reference.ops.experimental",
}


# Reference implementations that change process-wide state: StringNormalizer calls setlocale(LC_ALL, <its
# locale attribute>) and leaves it set, which changed the user's text encoding (open() turned ASCII after a
# model with locale="C" ran). Their calls restore the locale, under a lock (setlocale is process-wide).
_SETS_LOCALE = {("", "StringNormalizer")}
_LOCALE_LOCK = threading.Lock()


def _keeping_locale(run: Callable[..., Any]) -> Callable[..., Any]:
    def call(*inputs: Any) -> Any:
        with _LOCALE_LOCK:
            saved = locale.setlocale(locale.LC_ALL)
            try:
                return run(*inputs)
            finally:
                locale.setlocale(locale.LC_ALL, saved)

    return call


def _noop_log(*args: Any) -> None:
    return None


def _load(domain: str, op_type: str, opset: int, **kwargs: Any) -> Any:
    if domain == "":
        from onnx.reference.ops import load_op

        return load_op(domain, op_type, opset, evaluator_cls=ReferenceEvaluator, **kwargs)
    # The other domains' loaders take no node or type information.
    module = _DOMAIN_MODULES.get(domain)
    if module is None:
        raise NotImplementedError(f"onnx.reference has no domain {domain!r}")
    loader: Callable[..., Any] = importlib.import_module(module).load_op
    return loader(domain, op_type, opset)


def has_reference(node: ir.Node, opset: int) -> bool:
    """True when onnx.reference implements ``node``'s op at ``opset``."""
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    try:
        _load(domain, node.op_type, opset)
    except op_run.RuntimeContextError:
        return True
    except Exception:
        return False
    return True


def reference_kernel(info: NodeInfo) -> Kernel:
    """Wrap onnx.reference's implementation of ``info``'s op. Raises NotImplemented if it has none."""
    proto = ir.serde.serialize_node(info.node)
    run_params = {
        "log": _noop_log,
        "opsets": {info.domain: info.opset} if info.domain else {"": info.opset},
        "verbose": 0,
        "new_ops": {},
        "existing_functions": {},
        "evaluator_cls": ReferenceEvaluator,
    }
    try:
        cls = _load(info.domain, info.op_type, info.opset, node=proto)
    except op_run.RuntimeContextError:
        kernel: Callable[..., Any] = _ContextDependent(info, proto, run_params)
    except Exception as exc:
        raise NotImplementedError(
            f"no CPU kernel for op {info.op_type!r} (domain {info.domain or 'ai.onnx'!r}, opset {info.opset}) "
            f"of node {info.name!r}: {exc}"
        ) from exc
    else:
        kernel = cls(proto, run_params).run
    return _keeping_locale(kernel) if (info.domain, info.op_type) in _SETS_LOCALE else kernel


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
                onnx.helper.make_tensor_type_proto(
                    onnx.helper.np_dtype_to_tensor_dtype(np.asarray(x).dtype), None
                )
                for x in inputs
                if x is not None
            ]
            cls = _load(
                self._info.domain, self._info.op_type, self._info.opset, node=self._proto, input_types=types
            )
            impl = self._cache[key] = cls(self._proto, self._params)
        return impl.run(*inputs)
