"""Which binary a compiling session saves into, for EPs that lay payloads out at offsets final in a shared file."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epctx.ep.context_io import BinaryLayout
    from epctx.ep.contract import ExecutionProvider

__all__ = ["compile_target", "target_binary"]


# Set by the framework around a session's compile when its partitions will be saved into a binary that already
# holds entries (a weight-sharing group): EP -> that binary.
_TARGET: contextvars.ContextVar[Callable[[ExecutionProvider], BinaryLayout] | None] = contextvars.ContextVar(
    "epctx_compile_target", default=None
)


def target_binary(ep: ExecutionProvider) -> BinaryLayout | None:
    """For ``ExecutionProvider.compile``: the binary this session's partitions of ``ep`` will be saved into when
    it is shared with earlier models (``ep.share_ep_contexts``), so a payload can refer to offsets that are final
    in the shared file; None when the compiling session does not generate into a sharing group."""
    resolve = _TARGET.get()
    return None if resolve is None else resolve(ep)


@contextlib.contextmanager
def compile_target(resolve: Callable[[ExecutionProvider], BinaryLayout] | None) -> Iterator[None]:
    """The framework's side of ``target_binary``: around one session's compile."""
    token = _TARGET.set(resolve)
    try:
        yield
    finally:
        _TARGET.reset(token)
