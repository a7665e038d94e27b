"""Job results -> a package folder, and its atomic commit.

The compiled variants' context models (``<component>.<target>_ctx.onnx``) and binaries go into one shared asset
(``shared_assets/sha256-<hex>``, named by its directory hash), plain models into its ``<component>/`` folder;
binaries of one EP and SDK are merged (``epctx.package.share``), so the weights are there once, across targets
and across components that share weights (an LLM's prefill and decode). Each variant's folder holds ``epctx.json``
(``executor_info["epctx"]``: the job's content key and options); its ``executor_info["ort"]`` names its model as
``sha256:<hex>/<file>``. Everything written depends on the SPEC and the job results only (no time, no host), so
the same inputs give byte-identical packages.

The package is built in a staging folder beside the destination and swapped in (``renameat2`` with
``RENAME_EXCHANGE`` on Linux, else two renames): readers see the old package or the new one.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from epctx.farm.jobs import CONTEXT_MODEL, PLAIN_EP, PLAIN_MODEL, Job
from epctx.package.layout import MANIFEST, SCHEMA_VERSION, asset_folder_name, directory_hash, manifest_json
from epctx.package.share import Compiled, share_binaries

__all__ = ["assemble", "commit"]


def _compatibility(model: Path, ep: str) -> str | None:
    from epctx.cache.compatibility import get_compatibility_info_from_model

    return get_compatibility_info_from_model(model, ep)


def _asset(staging: Path, jobs: Sequence[tuple[Job, Path]]) -> tuple[str, dict[Job, str]]:
    """The package's shared asset (every component: the pair's prefill and decode share their weights too);
    (its URI, job -> its model file inside it)."""
    folder = staging / "shared_assets" / ".staging"
    folder.mkdir(parents=True)
    ids = {job: f"{job.component}.{job.target}" for job, _ in jobs}
    compiled = [Compiled(ids[job], result / CONTEXT_MODEL) for job, result in jobs if job.ep != PLAIN_EP]
    made = share_binaries(compiled, folder, "shared") if compiled else {}
    files = {job: made[ids[job]] for job, _ in jobs if job.ep != PLAIN_EP}
    for job, result in jobs:
        if job.ep == PLAIN_EP:  # the source model, in its component's folder (external data keeps its names)
            files[job] = f"{job.component}/{job.target}.onnx"
            (folder / job.component).mkdir(exist_ok=True)
            for item in sorted(result.iterdir()):
                if item.is_file() and not item.name.startswith("."):
                    name = f"{job.target}.onnx" if item.name == PLAIN_MODEL else item.name
                    shutil.copyfile(item, folder / job.component / name)
    uri = directory_hash(folder)
    os.rename(folder, staging / "shared_assets" / asset_folder_name(uri))
    return uri, files


def _variant(
    staging: Path, job: Job, key: str, device: str | None, uri: str, model: str, compat: str | None
) -> Any:
    directory = staging / job.component / job.target
    directory.mkdir(parents=True)
    own = {"job_key": key, "ep": job.ep, "provider_options": dict(job.options), "model": model}
    (directory / "epctx.json").write_bytes(manifest_json(own))
    body: dict[str, Any] = {"variant_directory": f"{job.component}/{job.target}", "ep": job.ep}
    if device is not None:
        body["device"] = device
    if compat is not None:
        body["compatibility_string"] = compat
    ort: dict[str, Any] = {"model_file": f"{uri}/{model}"}
    if job.options and job.ep != PLAIN_EP:
        ort["provider_options"] = dict(job.options)
    body["executor_info"] = {"ort": ort, "epctx": "epctx.json"}
    return body


def assemble(
    staging: Path,
    package: Mapping[str, str],
    results: Sequence[tuple[Job, str, str | None, Path]],  # (job, key, device, result folder) in SPEC order
) -> None:
    """Write the package into the empty folder ``staging``."""
    uri, files = _asset(staging, [(job, folder) for job, _, _, folder in results])
    asset = staging / "shared_assets" / asset_folder_name(uri)
    components: dict[str, Any] = {}
    for job, key, device, _ in results:
        compat = None if job.ep == PLAIN_EP else _compatibility(asset / files[job], job.ep)
        variants = components.setdefault(job.component, {"variants": {}})["variants"]
        variants[job.target] = _variant(staging, job, key, device, uri, files[job], compat)
    manifest: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "layout": "portable"}
    for field in ("name", "version", "description"):
        if field in package:
            manifest[f"package_{field}" if field != "description" else field] = package[field]
    manifest["components"] = components
    (staging / MANIFEST).write_bytes(manifest_json(manifest))


def staging_for(dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{dest.name}.staging-", dir=dest.parent))


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where it is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, exchange = -100, 2
    done = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), exchange)
    return bool(done == 0)


def commit(staging: Path, dest: Path) -> None:
    """Make ``staging`` the package at ``dest`` (the previous one, if any, is removed after the swap)."""
    with contextlib.suppress(OSError):
        os.chmod(staging, 0o777 & ~_umask())
    if not dest.exists():
        os.rename(staging, dest)
        return
    if _exchange(staging, dest):
        shutil.rmtree(staging)  # now the old package
        return
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    os.rename(dest, old)
    os.rename(staging, dest)
    shutil.rmtree(old)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def describe(dest: Path) -> dict[str, Any]:
    return dict(json.loads((dest / MANIFEST).read_text(encoding="utf-8")))
