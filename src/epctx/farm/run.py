"""The build: SPEC -> jobs -> (cache hits skipped) executor -> assemble -> atomic commit, with a row per job.

A failed job stops the build (the other jobs are cancelled) with a :class:`JobFailed` naming the job and the
compiler's message; the package at the destination is untouched. Jobs that finished are kept in the job cache,
so the next build does only what is left.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from epctx.errors import InvalidArgument
from epctx.farm.jobs import Job, JobFailed, JobResult, cached, job_key, job_meta, store_result
from epctx.farm.spec import read_spec
from epctx.package.layout import MANIFEST

__all__ = ["BuildReport", "Row", "build"]


class Executor(Protocol):
    name: str

    def run(self, jobs: Any) -> Any: ...


@dataclasses.dataclass
class Row:
    job: str
    where: str  # the host (and Ray node) that compiled it, or "cache"
    seconds: float
    size: int
    verdict: str = "-"


@dataclasses.dataclass
class BuildReport:
    package: Path
    executor: str
    rows: list[Row]
    seconds: float = 0.0
    assemble_seconds: float = 0.0  # merging binaries, hashing assets, writing and committing the package

    def table(self) -> list[str]:
        head = f"{'job':<32} {'where':<24} {'time s':>8} {'size':>12}  verdict here"
        lines = [head, "-" * len(head)]
        lines += [
            f"{r.job:<32} {r.where:<24} {r.seconds:>8.2f} {r.size:>12,}  {r.verdict}" for r in self.rows
        ]
        done = sum(1 for r in self.rows if r.where != "cache")
        lines.append(
            f"{len(self.rows)} jobs: {done} run on {self.executor}, {len(self.rows) - done} from the cache"
        )
        return lines


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def _run_jobs(
    executor: Executor,
    todo: list[tuple[Job, str]],
    cache: Path,
    rows: dict[str, Row],
    progress: Callable[[str], None],
) -> None:
    keys = {job: key for job, key in todo}
    for n, (job, outcome) in enumerate(executor.run([job for job, _ in todo]), 1):
        if not isinstance(outcome, JobResult):
            if isinstance(outcome, JobFailed):
                raise outcome
            raise JobFailed(f"job {job.name} ({job.ep}) failed: {type(outcome).__name__}: {outcome}")
        folder = store_result(cache, keys[job], outcome)
        rows[job.name] = Row(job.name, outcome.host, outcome.seconds, _size(folder))
        progress(f"[{n}/{len(todo)}] {job.name}: {outcome.seconds:.1f} s on {outcome.host}")


def build(
    spec_path: str | Path,
    output: str | Path,
    executor: Executor,
    *,
    cache: str | Path | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> BuildReport:
    import time

    from epctx.farm.assemble import assemble, commit, staging_for

    start = time.perf_counter()
    spec = read_spec(spec_path)
    dest = Path(output)
    if dest.exists() and not (dest / MANIFEST).is_file() and (not dest.is_dir() or any(dest.iterdir())):
        raise InvalidArgument(
            f"{str(dest)!r} exists and is not a model package: the build replaces its output, choose another"
        )
    cache_dir = Path(cache) if cache is not None else dest.with_name(dest.name + ".jobs")
    jobs = [Job(c, t.name, str(src), t.ep, t.options) for c, src in spec.components for t in spec.targets]
    devices = {t.name: t.device for t in spec.targets}
    keys = {job: job_key(job) for job in jobs}
    rows: dict[str, Row] = {}
    todo = []
    for job in jobs:
        hit = cached(cache_dir, keys[job])
        if hit is None:
            todo.append((job, keys[job]))
        else:
            rows[job.name] = Row(job.name, "cache", float(job_meta(hit)["seconds"]), _size(hit))
    progress(f"{len(jobs)} jobs: {len(jobs) - len(todo)} cached, {len(todo)} to run on {executor.name}")
    _run_jobs(executor, todo, cache_dir, rows, progress)
    assembling = time.perf_counter()
    staging = staging_for(dest)
    try:
        results = [(job, keys[job], devices[job.target], cache_dir / keys[job]) for job in jobs]
        assemble(staging, spec.package, results)
        commit(staging, dest)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    done = time.perf_counter()
    report = BuildReport(
        dest, executor.name, [rows[job.name] for job in jobs], done - start, done - assembling
    )
    _verdicts(report)
    return report


def _verdicts(report: BuildReport) -> None:
    from epctx.package.layout import read_package
    from epctx.package.select import rank_variants

    package = read_package(report.package)
    found = {}
    for component in package.components:
        for ranked in rank_variants(component):
            found[f"{component.name}/{ranked.variant.name}"] = ranked.verdict.status.name.removeprefix("EP_")
    for row in report.rows:
        row.verdict = found.get(row.job, "-")
