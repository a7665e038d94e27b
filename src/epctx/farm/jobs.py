"""One job = one (component, target) pair: compile the component's source model for the target.

Its content key is a sha256 over everything that changes what it makes: the source model's bytes and those of
every external data file it references, the EP, its provider options, the EP's SDK version and epctx's version.
Results are kept in a job cache folder (``<key>/``): a build whose job key is there skips the job.

:func:`run_job` is what a worker runs (a process of the local pool or a Ray task): it takes plain values and
returns the files it made as bytes, so results travel the same way from any worker.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from epctx.errors import EPCtxError, Fail

__all__ = [
    "CONTEXT_MODEL",
    "Job",
    "JobFailed",
    "JobResult",
    "job_key",
    "run_job",
    "run_job_from_files",
    "source_files",
]

CONTEXT_MODEL = "model_ctx.onnx"
PLAIN_MODEL = "model.onnx"
PLAIN_EP = "CPUExecutionProvider"


@dataclasses.dataclass(frozen=True)
class Job:
    component: str
    target: str
    source: str  # the source model's path
    ep: str
    options: tuple[tuple[str, str], ...]

    @property
    def name(self) -> str:
        return f"{self.component}/{self.target}"


@dataclasses.dataclass(frozen=True)
class JobResult:
    job: Job
    files: dict[str, bytes]  # file name -> bytes (the context model and its binaries)
    seconds: float
    host: str  # where it ran (host name, and the Ray node when on Ray)


class JobFailed(Fail):
    """A job whose compile failed: the job's name and the compiler's message."""


def _external_files(source: Path) -> list[Path]:
    import onnx

    try:
        model = onnx.load(str(source), load_external_data=False)
    except Exception:  # not a model: the job fails with the compiler's own message
        return []
    found = set()
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in tensor.external_data if e.key == "location"), None)
            if location:
                found.add(source.parent / location)
    return sorted(found)


def _sdk_version(job: Job) -> str:
    """The EP's SDK version and its compatibility string for the job's options (an EP made, nothing compiled)."""
    if job.ep == PLAIN_EP:
        return "-"
    from epctx.options import SessionOptions
    from epctx.providers.selection import resolve_providers

    try:
        providers = resolve_providers(
            [(job.ep, dict(job.options))], None, SessionOptions(), source=job.source
        )
    except EPCtxError as exc:
        raise JobFailed(f"job {job.name} ({job.ep}): {exc}") from None
    ep = next(p for p in providers if p.name == job.ep)
    return f"{ep.sdk_version()};{ep.compatibility_info()}"


def job_key(job: Job) -> str:
    from epctx._version import __version__

    digest = hashlib.sha256()
    source = Path(job.source)
    for path in [source, *_external_files(source)]:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    recipe = {"ep": job.ep, "options": list(job.options), "sdk": _sdk_version(job), "epctx": __version__}
    digest.update(json.dumps(recipe, sort_keys=True).encode())
    return digest.hexdigest()


def _compile(job: Job, folder: Path) -> None:
    from epctx.compiler import ModelCompiler
    from epctx.options import SessionOptions

    if job.ep == PLAIN_EP:  # the source model itself, external data beside it
        source = Path(job.source)
        shutil.copyfile(source, folder / PLAIN_MODEL)
        for extra in _external_files(source):
            shutil.copyfile(extra, folder / extra.name)
        return
    so = SessionOptions()
    so.add_provider(job.ep, dict(job.options))
    ModelCompiler(so, job.source).compile_to_file(str(folder / CONTEXT_MODEL))


def run_job(job: Job) -> JobResult:
    """Compile ``job`` in a fresh temporary folder; the files made, as bytes."""
    start = time.perf_counter()
    host = socket.gethostname()
    node = os.environ.get("EPCTX_FARM_NODE")
    with tempfile.TemporaryDirectory(prefix="epctx-job-") as tmp:
        folder = Path(tmp)
        try:
            _compile(job, folder)
        except EPCtxError as exc:
            raise JobFailed(f"job {job.name} ({job.ep}) failed: {exc}") from None
        except Exception as exc:  # the compiler's own error: its message is what the user needs
            raise JobFailed(f"job {job.name} ({job.ep}) failed: {type(exc).__name__}: {exc}") from None
        files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
    return JobResult(job, files, time.perf_counter() - start, f"{host}:{node}" if node else host)


def source_files(source: str) -> dict[str, bytes]:
    """The source model and the external data files it references, by path relative to its folder: what a worker
    without this file system needs (shipped once per source through Ray's object store)."""
    path = Path(source)
    files = {path.name: path.read_bytes()}
    for extra in _external_files(path):
        files[extra.relative_to(path.parent).as_posix()] = extra.read_bytes()
    return files


def run_job_from_files(job: Job, files: dict[str, bytes]) -> JobResult:
    """:func:`run_job` on a copy of the source written from ``files`` (same file names: same output bytes)."""
    with tempfile.TemporaryDirectory(prefix="epctx-source-") as tmp:
        for name, data in files.items():
            target = Path(tmp, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        result = run_job(dataclasses.replace(job, source=str(Path(tmp, Path(job.source).name))))
    return dataclasses.replace(result, job=job)


def store_result(cache: Path, key: str, result: JobResult) -> Path:
    """Keep a job's files under ``cache/<key>`` (written beside, then renamed: never half there)."""
    final = cache / key
    if final.is_dir():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=cache))
    for name, data in result.files.items():
        (tmp / name).write_bytes(data)
    meta = {"job": result.job.name, "seconds": round(result.seconds, 3), "host": result.host}
    (tmp / ".job.json").write_text(json.dumps(meta, sort_keys=True), encoding="utf-8")
    try:
        os.rename(tmp, final)
    except OSError:  # another build stored it first
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def cached(cache: Path, key: str) -> Path | None:
    folder = cache / key
    return folder if (folder / ".job.json").is_file() else None


def job_meta(folder: Path) -> dict[str, Any]:
    return dict(json.loads((folder / ".job.json").read_text(encoding="utf-8")))
