"""The IREE execution provider (``iree.runtime`` to load and run; ``iree.compiler`` only in compile workers):
partitions compiled ahead of time for ``llvm-cpu``, for this CPU or another one (``target``).

The declaration below is how the registry finds this EP (by its folder); it imports nothing, IREE included.
To compile for other CPUs through virtual devices, register this folder's library with a name ending in
``.virtual``: ``epctx.register_execution_provider_library("iree.virtual", "epctx.providers.iree.library")``."""

from __future__ import annotations

from typing import Any

EP_NAME = "IREEExecutionProvider"
EP_CLASS = "epctx.providers.iree.provider:IREEExecutionProvider"
EP_VENDOR = "IREE"
EP_REQUIRES = ("iree.runtime",)
EP_COMPATIBILITY = (
    "epctx.providers.iree.compatibility"  # its compatibility verdicts, without importing the backend
)
EP_DEVICES = "epctx.providers.iree.devices:supported_devices"  # the CPU (virtual targets: see library.py)
EP_LIBRARY = "epctx.providers.iree.library"  # the plugin library that may replace this declaration
EP_BY_POLICY = False  # compiles for seconds to minutes: used when asked for, never picked by a policy

__all__ = ["IREEExecutionProvider"]


def __getattr__(name: str) -> Any:
    if name == "IREEExecutionProvider":
        from epctx.providers.iree.provider import IREEExecutionProvider

        return IREEExecutionProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
