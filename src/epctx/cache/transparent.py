"""The transparent cache: ``epctx.context_cache=<folder>`` on an ordinary session over a *source* model.

The session computes the key (``key.py``) of its model, providers and options. When the key's current
generation (``store.py``) exists and its verdict here is optimal (``verdicts.check_model``), the session loads
that context model and compiles nothing. Otherwise, holding the key's lock (concurrent first runs wait for
one compile), it compiles into a new generation (the ordinary context generation, a transaction), switches
the key to it atomically, prunes the key's other generations and, with ``epctx.context_cache_max_mb``, the
least recently used keys; the compiling session serves what it compiled. Logged under ``epctx`` at INFO:
the key, compile or load, times.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epctx import options as opt
from epctx.cache.key import Digests, cache_key
from epctx.cache.store import CONTEXT_NAME, CacheEntry, ContextCache

if TYPE_CHECKING:
    from epctx.ep._contract import ExecutionProvider

__all__ = ["through_cache"]

logger = logging.getLogger("epctx")

Compile = Callable[[opt.SessionOptions], None]


def through_cache(
    source: str | os.PathLike[str] | bytes,
    providers: Sequence[ExecutionProvider],
    options: opt.SessionOptions,
    compile_into: Compile,
    config: opt.SessionConfig | None = None,
) -> Path | None:
    """The cached context model to load for this session, or None once ``compile_into(options)`` has
    compiled (and the session served) a new generation, or found nothing to compile. ``config``: ``options``'
    config as the session parsed it (None: parsed here)."""
    config = opt.SessionConfig.of(options) if config is None else config
    started = time.perf_counter()
    cache = ContextCache(config.context_cache)
    key, parts = cache_key(source, providers, options, Digests(cache.folder), config)
    entry = cache.entry(key)
    hit = _usable(entry)
    if hit is None:
        with entry.locked():
            hit = _usable(entry)  # another process may have compiled it while this one waited
            if hit is None:
                _compile(entry, parts, options, compile_into)
        if hit is None:
            _bound(cache, config)  # after the key's lock: pruning takes each key's lock in turn
            return None
    entry.touch()
    entry.tidy(hit.parent.name)
    logger.info("epctx.context_cache: key %s: loading %s (key in %.1f ms)", key, hit, _ms(started))
    return hit


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1e3


def _usable(entry: CacheEntry) -> Path | None:
    """The current generation's context model when its verdict here is optimal (else None: recompile)."""
    from epctx.cache.verdicts import serves_here

    ctx = entry.current()
    if ctx is None:
        return None
    return ctx if serves_here(ctx, "epctx.context_cache: the cached context") else None


def _compile(
    entry: CacheEntry,
    parts: Mapping[str, Any],
    options: opt.SessionOptions,
    compile_into: Compile,
) -> None:
    generation = entry.new_generation()
    ctx = generation / CONTEXT_NAME
    logger.info("epctx.context_cache: key %s: compiling into %s", entry.key, generation)
    started = time.perf_counter()
    derived = opt.with_config(
        options,
        {
            opt.EP_CONTEXT_ENABLE: "1",
            opt.EP_CONTEXT_FILE_PATH: str(ctx),
            opt.EP_CONTEXT_EMBED_MODE: "0",
            opt.CONTEXT_CACHE: None,
        },
    )
    try:
        compile_into(derived)
    except BaseException:
        shutil.rmtree(generation, ignore_errors=True)
        raise
    if not ctx.is_file():
        shutil.rmtree(generation, ignore_errors=True)
        logger.info("epctx.context_cache: nothing was compiled: nothing cached for key %s", entry.key)
        return
    entry.commit(generation, parts)
    logger.info(
        "epctx.context_cache: key %s: compiled and cached generation %s in %.2f s",
        entry.key, generation.name, time.perf_counter() - started,
    )  # fmt: skip


def _bound(cache: ContextCache, config: opt.SessionConfig) -> None:
    limit = config.context_cache_max_mb
    if limit is None:
        return
    max_bytes = int(limit * 1e6)
    removed = cache.prune(max_bytes)
    if removed:
        logger.info("epctx.context_cache: pruned %s", ", ".join(removed))
