"""The guard at the single compile point: ``no_compile()`` / ``EPCTX_NO_COMPILE=1`` make any EP compile raise
(loading a context model must not compile). Imports nothing heavy, so ``epctx.testing.no_compile`` around a
context-model load adds no import of onnx or onnx-ir."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from epctx.errors import ModelRequiresCompilation

if TYPE_CHECKING:
    from epctx.ep.contract import ExecutionProvider

__all__ = ["NO_COMPILE_ENV", "check_compile_allowed", "no_compile"]

_COMPILE_FORBIDDEN: contextvars.ContextVar[bool] = contextvars.ContextVar("epctx_no_compile", default=False)
NO_COMPILE_ENV = "EPCTX_NO_COMPILE"  # "1": every compile in the process raises (``epctx.testing.no_compile``)


@contextlib.contextmanager
def no_compile() -> Iterator[None]:
    """Inside the block any EP compile raises ModelRequiresCompilation (loading a context model must not
    compile). The public face is ``epctx.testing.no_compile``."""
    token = _COMPILE_FORBIDDEN.set(True)
    try:
        yield
    finally:
        _COMPILE_FORBIDDEN.reset(token)


def check_compile_allowed(ep: ExecutionProvider, count: int) -> None:
    """The guard at the single compile point. Read only when something is about to compile: a session that
    loads a context model, and run(), never look at the environment."""
    if _COMPILE_FORBIDDEN.get():
        why = "inside epctx.testing.no_compile()"
    elif os.environ.get(NO_COMPILE_ENV, "") not in ("", "0"):
        why = f"with {NO_COMPILE_ENV}={os.environ[NO_COMPILE_ENV]}"
    else:
        return
    raise ModelRequiresCompilation(
        f"{ep.name} was asked to compile {count} partition(s) {why}: a context model made for this EP "
        "must load without compiling"
    )
