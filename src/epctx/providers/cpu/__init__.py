"""The CPU execution provider: numpy kernels for every standard op.

The declaration below is how the registry finds this EP (by its folder); it imports nothing."""

from __future__ import annotations

from typing import Any

EP_NAME = "CPUExecutionProvider"
EP_CLASS = "epctx.providers.cpu.provider:CPUExecutionProvider"
EP_VENDOR = "epctx"
EP_REQUIRES: tuple[str, ...] = ()

__all__ = ["CPUExecutionProvider"]


def __getattr__(name: str) -> Any:
    if name == "CPUExecutionProvider":
        from epctx.providers.cpu.provider import CPUExecutionProvider

        return CPUExecutionProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
