"""The example execution provider: a small pure-numpy compiling EP (the template for EP authors).

The declaration below is how the registry finds this EP (by its folder); it imports nothing."""

from __future__ import annotations

from typing import Any

EP_NAME = "ExampleExecutionProvider"
EP_CLASS = "epctx.providers.example.provider:ExampleExecutionProvider"
EP_VENDOR = "epctx"
EP_REQUIRES: tuple[str, ...] = ()
EP_BY_POLICY = False  # a template, not a faster backend: used when asked for, never picked by a policy
# How the conformance suite (epctx.testing.conformance) runs this EP: numpy in float32, as onnxruntime's CPU EP.
EP_CONFORMANCE = {"atol": 1e-5, "rtol": 1e-5}

__all__ = ["ExampleExecutionProvider"]


def __getattr__(name: str) -> Any:
    if name == "ExampleExecutionProvider":
        from epctx.providers.example.provider import ExampleExecutionProvider

        return ExampleExecutionProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
