"""Where jobs run: :class:`LocalPool` (processes on this machine, as many as the cores and the memory allow) or
:class:`RayExecutor` (tasks on a Ray cluster; Ray is imported here only, and only when a build asks for it).

Both yield (job, result or the job's exception) as jobs finish; the build decides what a failure means.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing
import os
from collections.abc import Iterator, Sequence
from typing import Any

from epctx.errors import Fail, InvalidArgument
from epctx.farm.jobs import Job, JobResult, run_job, run_job_from_files, source_files

__all__ = ["LocalPool", "RayExecutor", "default_workers"]

_JOB_MEMORY = 2 << 30  # what one compile may take (IREE on a large model: about 1-2 GiB)

Outcome = tuple[Job, JobResult | BaseException]


def default_workers(jobs: int) -> int:
    """Workers for ``jobs`` jobs: no more than the cores, nor than the available memory allows."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open("/proc/meminfo") as fh:
            available = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:"))
        by_memory = max(1, available // _JOB_MEMORY)
    except (OSError, StopIteration, ValueError):
        by_memory = cores
    return max(1, min(cores, by_memory, jobs))


class LocalPool:
    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        if workers is not None and workers < 1:
            raise InvalidArgument(f"workers must be 1 or more, got {workers}")
        self.workers = workers

    def run(self, jobs: Sequence[Job]) -> Iterator[Outcome]:
        if not jobs:
            return
        workers = self.workers or default_workers(len(jobs))
        context = multiprocessing.get_context("spawn")  # workers start clean: no inherited threads or locks
        with cf.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = {pool.submit(run_job, job): job for job in jobs}
            try:
                for future in cf.as_completed(futures):
                    error = future.exception()
                    yield futures[future], error if error is not None else future.result()
            finally:
                for future in futures:
                    future.cancel()


class RayExecutor:
    """Jobs as Ray tasks (one CPU each, retried by Ray when their node dies); each source model (and its external
    data) is put in the object store once and read from there by the tasks, the results come back as bytes."""

    name = "ray"

    def __init__(self, address: str, *, retries: int = 3) -> None:
        self.address = address
        self.retries = retries

    def _ray(self) -> Any:
        try:
            import ray
        except ImportError:
            raise Fail("--ray needs Ray: pip install 'epctx[farm]' (or pip install ray)") from None
        if not ray.is_initialized():
            ray.init(address=self.address, log_to_driver=False, logging_level=logging.ERROR)
        return ray

    def run(self, jobs: Sequence[Job]) -> Iterator[Outcome]:
        if not jobs:
            return
        ray = self._ray()
        remote = ray.remote(num_cpus=1, max_retries=self.retries, retry_exceptions=False)(_ray_job)
        shipped = {source: ray.put(source_files(source)) for source in dict.fromkeys(j.source for j in jobs)}
        pending = {remote.remote(job, shipped[job.source]): job for job in jobs}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    job = pending.pop(ref)
                    try:
                        yield job, ray.get(ref)
                    except ray.exceptions.RayTaskError as exc:
                        yield job, exc.cause if isinstance(exc.cause, BaseException) else exc
                    except ray.exceptions.RayError as exc:
                        yield job, exc
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)


def _ray_job(job: Job, files: dict[str, bytes]) -> JobResult:
    """A Ray task: the source arrives through the object store (the node needs no shared file system)."""
    import ray

    os.environ["EPCTX_FARM_NODE"] = ray.get_runtime_context().get_node_id()[:8]
    return run_job_from_files(job, files)
