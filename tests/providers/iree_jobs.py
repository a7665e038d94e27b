"""A stand-in for ``epctx.providers.iree.compile._compile_job`` that fails, as IREE would, every job asking for one
optional rewrite (its ``job.json`` key), and compiles the others for real: for the tests that a job failing with a
rewrite is tried again without it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def failing_with(key: str, asked: list[bool], error: str) -> Callable[..., Any]:
    """The stand-in: each job's ``key`` noted in ``asked``; those with it set fail at ``compile`` with ``error``."""
    from epctx.providers.iree import compile as iree_compile

    real = iree_compile._compile_job

    def compile_job(
        folder: Path, label: str, start: float, limits: iree_compile.JobLimits = iree_compile.NO_LIMITS
    ) -> Any:
        job = json.loads((folder / "job.json").read_text(encoding="utf-8"))
        asked.append(job[key])
        if job[key]:
            return iree_compile.CompileResult(False, stage="compile", error=error, rewritten=(key,))
        return real(folder, label, start, limits)

    return compile_job
