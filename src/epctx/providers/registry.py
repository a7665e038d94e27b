"""Which EPs exist, which are available here, and how to build them by name (imports are lazy)."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from typing import TYPE_CHECKING

from epctx.errors import InvalidArgument

if TYPE_CHECKING:
    from epctx.providers.base import ExecutionProvider

__all__ = ["available_providers", "create_provider", "register_provider_class"]

# name -> ("module:Class", modules that must be importable for the EP to be available)
_BUILTIN: dict[str, tuple[str, tuple[str, ...]]] = {
    "CPUExecutionProvider": ("epctx.providers.cpu:CPUExecutionProvider", ()),
    "ExampleExecutionProvider": ("epctx.providers.example:ExampleExecutionProvider", ()),
    "OpenVINOExecutionProvider": ("epctx.providers.openvino:OpenVINOExecutionProvider", ("openvino",)),
}
_REGISTERED: dict[str, type[ExecutionProvider]] = {}


def register_provider_class(cls: type[ExecutionProvider]) -> None:
    """Make a Python EP class selectable by its ``name`` in ``providers=[...]``."""
    if not getattr(cls, "name", None):
        raise InvalidArgument(f"{cls.__qualname__} has no 'name'")
    _REGISTERED[cls.name] = cls


def available_providers() -> list[str]:
    """EPs usable on this machine, in default precedence order (CPU last)."""
    names = [n for n in _REGISTERED if n != "CPUExecutionProvider"]
    for name, (_, needs) in _BUILTIN.items():
        if name != "CPUExecutionProvider" and all(importlib.util.find_spec(m) is not None for m in needs):
            names.append(name)
    names.append("CPUExecutionProvider")
    return names


def provider_class(name: str) -> type[ExecutionProvider]:
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in _BUILTIN:
        raise InvalidArgument(
            f"unknown execution provider {name!r}; available: {', '.join(available_providers())}"
        )
    target, needs = _BUILTIN[name]
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        raise InvalidArgument(
            f"execution provider {name!r} needs the Python package(s) {', '.join(missing)}, which are not "
            "installed (pip install 'epctx[...]' with the matching extra)"
        )
    module, _, attr = target.partition(":")
    cls: type[ExecutionProvider] = getattr(importlib.import_module(module), attr)
    return cls


def create_provider(name: str, options: Mapping[str, str] | None = None) -> ExecutionProvider:
    return provider_class(name)(options)
