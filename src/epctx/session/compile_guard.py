"""The compile guard's names where callers import them from (the guard itself is ``epctx.ep.CompileGuard``,
checked at the single compile point ``epctx.ep._calls.compile_partitions`` and by capability probes).
Imports nothing heavy, so ``epctx.testing.no_compile`` around a context-model load adds no import of onnx or
onnx-ir."""

from __future__ import annotations

from epctx.ep._compiling import NO_COMPILE_ENV, no_compile

__all__ = ["NO_COMPILE_ENV", "no_compile"]
