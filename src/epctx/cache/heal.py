"""Self-healing contexts (``epctx.self_heal``): a context model whose verdict here is EP_UNSUPPORTED or
EP_SUPPORTED_PREFER_RECOMPILATION is compiled again from its source, when the source is reachable and is the
one it was compiled from.

- The source: ``ep.context_source_model_path``, else the EPContext nodes' ``onnx_model_filename`` beside the
  context model (onnxruntime's lookup). It is bound by the ``epctx.source_files`` metadata written at compile
  (the ``.onnx`` and its external data files: size and xxh3-128 each): a source changed since is not used.
- ``foreground``: the session compiles it in place (the generation transaction: a kill leaves the old context
  or the new one) and serves what it compiled.
- ``background``: the session serves now, with the current binary when it runs here (PREFER_RECOMPILATION), else
  with the source on the CPU EP (UNSUPPORTED), while a thread compiles the new context in place; the next
  session loads it. One heal per context at a time (a lock file beside it; a second background heal of the
  same context skips, a foreground one waits and looks again).
- Never silent: each step is logged under ``epctx`` (WARNING when a context is healed or cannot be), and
  ``epctx check`` says whether the context can heal, from where.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from epctx import options as opt
from epctx.epcontext.identity import SOURCE_FILES_KEY

__all__ = [
    "HealPlan",
    "find_source",
    "heal_lock",
    "plan_heal",
    "start_background",
    "wait_background",
]

logger = logging.getLogger("epctx")

_JOBS: list[threading.Thread] = []
_JOBS_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True, slots=True)
class HealPlan:
    context: Path
    source: Path
    status: str  # the verdict's name (EP_UNSUPPORTED / EP_SUPPORTED_PREFER_RECOMPILATION)
    reasons: str
    embed: bool

    @property
    def runs_here(self) -> bool:
        return self.status != "EP_UNSUPPORTED"


def _text(raw: Any) -> str:
    return (
        bytes(raw).decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray, memoryview)) else str(raw)
    )


def _scan(ctx: Path) -> tuple[dict[str, str], list[str], bool]:
    """(metadata, the nodes' onnx_model_filename values, whether a node embeds its binary)."""
    from epctx.cache.scan import read_mapped, scan_model

    scanned = read_mapped(ctx, scan_model)
    names = [
        _text(n.attributes["onnx_model_filename"][1])
        for n in scanned.nodes
        if "onnx_model_filename" in n.attributes
    ]
    embed = any(n.attributes.get("embed_mode", (0, 1))[1] == 1 for n in scanned.nodes)
    return dict(scanned.metadata), names, embed


def find_source(ctx: Path, config: opt.SessionConfig) -> tuple[Path | None, str]:
    """The source model this context can heal from, or None; and why (for logs and ``epctx check``)."""
    from epctx.ep._weightless import file_digest

    metadata, names, _ = _scan(ctx)
    explicit = config.ep_context_source_model_path
    plain = [n for n in dict.fromkeys(names) if n and Path(n).name == n]
    if explicit:
        candidate = Path(explicit)
    elif len(plain) == 1:
        candidate = ctx.parent / plain[0]
    else:
        return None, f"no source model recorded; set {opt.EP_CONTEXT_SOURCE_MODEL_PATH}"
    if not candidate.is_file():
        return None, f"the source model {str(candidate)!r} is not there"
    record = metadata.get(SOURCE_FILES_KEY)
    if record is None:
        return None, f"the context records no digest of its source ({SOURCE_FILES_KEY}): it cannot be bound"
    rows = json.loads(record)
    for k, (location, size, digest) in enumerate(rows):
        path = candidate if k == 0 else candidate.parent / location
        if not path.is_file():
            return None, f"the source's file {str(path)!r} is not there"
        if file_digest(path) != (size, digest):
            return None, f"the source's file {str(path)!r} changed since the context was compiled from it"
    return candidate, f"source {str(candidate)!r} (its {len(rows)} file(s) as compiled from)"


def plan_heal(ctx: Path, config: opt.SessionConfig) -> HealPlan | None:
    """A heal to do when the context is stale here and its source is reachable (logged either way)."""
    from epctx.cache.verdicts import check_model
    from epctx.ep._compatibility import OrtCompiledModelCompatibility as Compat

    verdict = check_model(ctx)
    if verdict.status not in (Compat.EP_UNSUPPORTED, Compat.EP_SUPPORTED_PREFER_RECOMPILATION):
        return None
    reasons = " | ".join(line.strip() for line in verdict.lines()[1:])
    source, why = find_source(ctx, config)
    if source is None:
        logger.warning("epctx.self_heal: %s is %s here and cannot heal: %s", ctx, verdict.status.name, why)
        return None
    return HealPlan(ctx, source, verdict.status.name, reasons, _scan(ctx)[2])


@contextlib.contextmanager
def heal_lock(ctx: Path, *, wait: bool) -> Iterator[bool]:
    """The context's heal lock (a file beside it); yields False when ``wait`` is off and another holds it."""
    path = ctx.parent / f".{ctx.name}.heal.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def start_background(plan: HealPlan, compile_into: Callable[[HealPlan], None]) -> threading.Thread:
    """Compile the context again in a thread (under its lock; skipped if another heal holds it)."""

    def run() -> None:
        with heal_lock(plan.context, wait=False) as held:
            if not held:
                logger.info("epctx.self_heal: %s is being healed by another session", plan.context)
                return
            try:
                compile_into(plan)
            except Exception as exc:  # a background thread has no caller to raise to: logged
                logger.warning("epctx.self_heal: background recompile of %s failed: %s", plan.context, exc)
                return
        logger.warning(
            "epctx.self_heal: %s recompiled in the background; the next session loads it", plan.context
        )

    thread = threading.Thread(target=run, name=f"epctx-self-heal:{plan.context.name}", daemon=True)
    with _JOBS_LOCK:
        _JOBS.append(thread)
    thread.start()
    return thread


def wait_background(timeout: float | None = None) -> bool:
    """Wait for the background heals of this process; True when none is left running."""
    with _JOBS_LOCK:
        jobs = list(_JOBS)
    for job in jobs:
        job.join(timeout)
    with _JOBS_LOCK:
        _JOBS[:] = [j for j in _JOBS if j.is_alive()]
        return not _JOBS
