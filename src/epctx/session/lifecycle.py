"""Where a session's model comes from before it is loaded, as the context lifecycle decides: a stale context healed
(``epctx.self_heal``), the context beside the model reused (``epctx.context_reuse``), the transparent cache
(``epctx.context_cache``). Each either hands back what to load (a path, the options and config to load it with) or
compiles the context itself through the session and hands back None (the session is made)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from epctx import options as opt
from epctx.providers.registry import create_provider

if TYPE_CHECKING:
    from epctx.ep import ExecutionProvider

__all__ = ["Creator", "Prepared", "heal_options", "prepare_source"]

logger = logging.getLogger("epctx")

Source = str | os.PathLike[str] | bytes
Prepared = tuple[Source, opt.SessionOptions, opt.SessionConfig]


class Creator(Protocol):
    """What of an InferenceSession under creation the lifecycle uses."""

    _options: opt.SessionOptions
    _providers: list[ExecutionProvider]
    _overwrite_context: bool
    _context_metadata: dict[str, str]
    _compiling_for_cache: bool

    def _create_full(
        self, source: Source, loading: str, data: bytes | None, config: opt.SessionConfig
    ) -> None: ...

    def _options_as(self, options: opt.SessionOptions) -> contextlib.AbstractContextManager[None]: ...


def prepare_source(
    session: Creator,
    source: Source,
    loading: str,
    config: opt.SessionConfig,
    heal_later: Callable[[Any], None],
) -> Prepared | None:
    """Heal, then reuse, then the cache, as the config asks; None once the session was made by compiling.
    ``heal_later(plan)`` compiles a stale context again in a session of its own (a background heal)."""
    options = session._options
    if config.self_heal != "off" and not config.context_cache and isinstance(source, (str, os.PathLike)):
        healed = _self_heal(session, Path(source), loading, config, heal_later)
        if healed is None:  # this session compiled the stale context again from its source
            return None
        source, options, config = healed
    if config.context_reuse:
        from epctx.cache.reuse import applies

        if isinstance(source, (str, os.PathLike)) and applies(
            source, config
        ):  # the existing context, or anew
            reused = _reuse_context(session, Path(source), loading, options, config)
            if reused is None:
                return None
            source, options, config = reused
    if config.context_cache:  # the transparent cache: load what it holds, or compile into it
        cached = _through_cache(session, source, loading, options, config)
        if cached is None:
            return None
        changes: dict[str, str | None] = {opt.CONTEXT_CACHE: None, opt.EP_CONTEXT_ENABLE: None}
        return str(cached), opt.with_config(options, changes), config.replace(changes)
    return source, options, config


def _self_heal(
    session: Creator, ctx: Path, loading: str, config: opt.SessionConfig, heal_later: Callable[[Any], None]
) -> Prepared | None:
    """``epctx.self_heal``: what to load (the context, or its source on the CPU EP while a background heal
    runs), or None when this session compiled the context again and serves it (``cache/heal.py``)."""
    from epctx.cache import heal

    options = session._options
    plan = heal.plan_heal(ctx, config)
    if plan is None:
        return ctx, options, config
    logger.warning(
        "epctx.self_heal: %s is %s here (%s); compiling it again from %s (%s)",
        ctx, plan.status, plan.reasons, plan.source, config.self_heal,
    )  # fmt: skip
    if config.self_heal == "foreground":
        with heal.heal_lock(ctx, wait=True):
            if heal.plan_heal(ctx, config) is None:  # healed by another session meanwhile
                return ctx, options, config
            session._overwrite_context = True
            derived = heal_options(plan, options)
            with session._options_as(derived):
                session._create_full(str(plan.source), loading, None, opt.SessionConfig.of(derived))
        logger.warning("epctx.self_heal: %s compiled again; this session serves it", ctx)
        return None
    heal.start_background(plan, heal_later)
    if plan.runs_here:
        return ctx, options, config
    logger.warning("epctx.self_heal: until then %s is served from %s on the CPU EP", ctx, plan.source)
    session._providers = [create_provider("CPUExecutionProvider")]
    changes: dict[str, str | None] = {opt.SELF_HEAL: None, opt.EP_CONTEXT_ENABLE: None}
    return str(plan.source), opt.with_config(options, changes), config.replace(changes)


def _reuse_context(
    session: Creator, source: Path, loading: str, options: opt.SessionOptions, config: opt.SessionConfig
) -> Prepared | None:
    """``epctx.context_reuse``: (the existing context to load, with options that generate nothing), or None
    once this session compiled the context again (in place) and serves it (``cache/reuse.py``)."""
    from epctx.cache import heal, reuse
    from epctx.epcontext.paths import context_model_path

    ctx = context_model_path(source, config)
    key = reuse.session_key(source, session._providers, options, config)
    ctx.parent.mkdir(parents=True, exist_ok=True)
    with heal.heal_lock(ctx, wait=True):
        if reuse.reusable(ctx, key):
            logger.info("epctx.context_reuse: loading %s (key %s)", ctx, key)
            changes: dict[str, str | None] = {opt.EP_CONTEXT_ENABLE: None, opt.CONTEXT_REUSE: None}
            return str(ctx), opt.with_config(options, changes), config.replace(changes)
        session._overwrite_context = True
        session._context_metadata = {reuse.CONTEXT_KEY: key}
        with session._options_as(options):
            session._create_full(source, loading, None, config)
    return None


def _through_cache(
    session: Creator, source: Source, loading: str, options: opt.SessionOptions, config: opt.SessionConfig
) -> Path | None:
    from epctx.cache.transparent import through_cache

    def compile_into(derived: opt.SessionOptions) -> None:
        session._compiling_for_cache = (
            True  # nothing to compile is the cache's to say (at INFO), not a warning
        )
        try:
            with session._options_as(derived):
                session._create_full(source, loading, None, opt.SessionConfig.of(derived))
        finally:
            session._compiling_for_cache = False

    return through_cache(source, session._providers, options, compile_into, config)


def heal_options(plan: Any, options: opt.SessionOptions) -> opt.SessionOptions:
    """A session's options to compile the context of ``plan`` again, in place, as it was (embedded or not)."""
    return opt.with_config(
        options,
        {
            opt.EP_CONTEXT_ENABLE: "1",
            opt.EP_CONTEXT_FILE_PATH: str(plan.context),
            opt.EP_CONTEXT_EMBED_MODE: "1" if plan.embed else "0",
            opt.SELF_HEAL: None,
        },
    )
