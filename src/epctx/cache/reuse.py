"""The transparent cache's second form: ``ep.context_enable=1`` with ``epctx.context_reuse=1`` on a session over
a *source* model whose context model (``ep.context_file_path``, else ``<stem>_ctx.onnx`` beside it) exists.

onnxruntime (1.32, measured) fails such a session ("Failed to generate EP context model since the file ... exists
already"), and so does epctx by default: its users rely on that (a build step that must not keep an old
context). With ``epctx.context_reuse=1`` the session instead loads the existing context when it records
(metadata ``epctx.context_key``) the key this session computes (``cache/key.py``: source bytes and external
data, providers and options, session options that reach compile, SDK versions, this CPU, epctx's version) and
its verdict here is optimal (``ep.context_embed_mode`` is in this key: the file is what was asked for); otherwise it compiles the context again in place (the generation transaction: a
kill leaves the old context or the new one, never a mix) and serves what it compiled. A context without the
key (compiled without reuse, or by another tool), one that cannot be read and a stale one are compiled again.
One session at a time decides and compiles per context (a lock file beside it, the self-heal's).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from epctx import options as opt
from epctx.cache.key import Digests, cache_key
from epctx.errors import EPCtxError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from epctx.ep import ExecutionProvider

__all__ = ["CONTEXT_KEY", "applies", "reusable", "session_key"]

logger = logging.getLogger("epctx")

CONTEXT_KEY = "epctx.context_key"  # model metadata: the cache key the context was compiled under


def applies(source: object, config: opt.SessionConfig) -> bool:
    """Whether this session takes the reuse path: opted in, generating, over a model file, no cache folder."""
    return (
        config.context_reuse
        and config.ep_context_enable
        and not config.context_cache
        and isinstance(source, (str, os.PathLike))
    )


def session_key(
    source: str | os.PathLike[str],
    providers: Sequence[ExecutionProvider],
    options: opt.SessionOptions,
    config: opt.SessionConfig,
) -> str:
    """The cache key of this session, with the embed mode (the context at the path is what was asked for)."""
    import hashlib

    key = cache_key(source, providers, options, Digests(None), config)[0]
    return hashlib.sha256(f"{key}|embed={int(config.ep_context_embed_mode)}".encode()).hexdigest()[:32]


def reusable(ctx: Path, key: str) -> bool:
    """Whether the context model at ``ctx`` was compiled under ``key`` and its verdict here is optimal."""
    from epctx.cache.scan import read_mapped, scan_model
    from epctx.cache.verdicts import serves_here

    if not ctx.is_file():
        return False
    try:
        recorded = read_mapped(ctx, scan_model).metadata.get(CONTEXT_KEY)
        if recorded != key:
            why = "it records no cache key" if recorded is None else f"it was compiled under key {recorded}"
            logger.info(
                "epctx.context_reuse: %s is stale (%s, this session's is %s); compiling it again",
                ctx,
                why,
                key,
            )
            return False
        return serves_here(ctx, "epctx.context_reuse:")
    except (EPCtxError, OSError, ValueError) as exc:
        logger.warning("epctx.context_reuse: %s cannot be read (%s); compiling it again", ctx, exc)
        return False
