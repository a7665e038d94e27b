"""What IREE's capability search learned, kept between processes (``epctx.ep.RecordCache`` in the user's cache,
``<cache>/iree-probes``): for a probed node set, whether IREE took it and IREE's message when it did not. A
second session of the same model (from the ``.onnx``, or from a context model whose nodes IREE declined) then
replays the search from these records: the same decisions, in the same order, with no compile but the final
compiles whose code it needs.

The key is what decides the outcome:

- the partition as the compile worker is given it (``partition_model``; initializers of at least
  ``_BYTES_BY_SHAPE`` bytes by name, type and shape only, as external references: IREE makes parameters of them
  and never reads their values; smaller ones, which IREE folds, by value) under a fixed graph name;
- the iree-compile flags, in order; iree-compiler's version;
- epctx's rewrite version (``rewrite_version``): the sources of the modules that turn a partition into IREE's
  input (``compile``, ``worker``, ``depthwise``) and epctx's version.

Kept: the outcome of every compile, passed or failed, flow probe (``--compile-to=flow``) or full, with IREE's
message and its seconds; never code. A full compile that passed read from the records (stage ``RECORDED``)
tells the search that the group compiles, at no cost to its budget; once the search is done, the groups kept so
are compiled for their code, outside the budget (``probing._compile_recorded``: the session's compile). Set
``EPCTX_IREE_PROBE_CACHE=0`` to neither read nor write the records (a search from scratch).
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epctx.ep import EPCTX_VERSION, RecordCache, installed_version, user_cache_dir
from epctx.providers.iree.worker import BUDGET_STAGE, MEMORY_STAGE

if TYPE_CHECKING:
    from epctx.ep import Partition
    from epctx.providers.iree.compile import CompileResult

__all__ = ["PROBE_FLAG", "RECORDED", "ProbeCache", "compiler_version", "probe_key", "rewrite_version"]

PROBE_FLAG = "--compile-to=flow"
# The stage of a passed compile read from the records: it holds no code (the compile stage compiles the group)
RECORDED = "recorded"
ENABLE_ENV = "EPCTX_IREE_PROBE_CACHE"
_FORMAT = 1
_BYTES_BY_SHAPE = 1024
# the modules that make IREE's input from a partition (the worker's graph rewrites, the flags chosen per job);
# tests/providers/test_iree_probe_cache.py checks that every module the worker imports is here (and node_rewrites,
# which they import)
_REWRITE_MODULES = (
    "compile.py",
    "options.py",
    "worker.py",
    "depthwise.py",
    "node_rewrites.py",
    "nhwc_pools.py",
    "space_to_depth.py",
    "pointwise.py",
    "upsample.py",
    "reciprocals.py",
    "workgroups.py",
)


@functools.cache
def rewrite_version() -> str:
    """epctx's version and a digest of the modules that make IREE's input from a partition."""
    digest = hashlib.sha256(EPCTX_VERSION.encode())
    here = Path(__file__).resolve().parent
    for name in _REWRITE_MODULES:
        digest.update((here / name).read_bytes())
    return f"{EPCTX_VERSION}+{digest.hexdigest()[:16]}"


@functools.cache
def compiler_version() -> str:
    return installed_version("iree", "iree-base-compiler", "iree-compiler") or "unknown"


def probe_key(partition: Partition, flags: Sequence[str]) -> str:
    """The digest of what decides ``partition``'s outcome with ``flags`` (see the module)."""
    from epctx.ep import partition_model, plan_weights_file

    plan = plan_weights_file(partition.initializers, location="weights.bin", min_size=_BYTES_BY_SHAPE)
    model = partition_model(partition, weights=plan.refs, graph_name="probe")
    digest = hashlib.sha256()
    for part in (f"format {_FORMAT}", compiler_version(), rewrite_version(), *flags):
        digest.update(part.encode() + b"\0")
    digest.update(model.SerializeToString(deterministic=True))
    return digest.hexdigest()


class ProbeCache:
    """The records of probed node sets: ``get`` a known outcome, ``put`` a new one (see the module)."""

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        self.enabled = os.environ.get(ENABLE_ENV, "1") not in ("0", "")
        self.records = RecordCache(folder or user_cache_dir("iree-probes"), what="IREE probe record")
        self.hits = 0

    def get(self, key: str) -> CompileResult | None:
        from epctx.providers.iree.compile import CompileResult

        found = self.records.get(key) if self.enabled else None
        if found is None or not _valid(found):
            return None
        self.hits += 1
        ok = bool(found["ok"])
        stage = RECORDED if ok else found["stage"]
        return CompileResult(ok, stage=stage, error=found["error"], seconds=float(found["seconds"]))

    def put(self, key: str, result: CompileResult, flags: Sequence[str]) -> None:
        """Keep ``result``'s outcome (never its code); not a compile the memory cap or the budget's end stopped:
        that is the limit's verdict, not the node set's (a session with a larger ``compile_memory_mb`` or
        ``capability_budget_s`` tries it again)."""
        if not self.enabled or result.stage in (MEMORY_STAGE, BUDGET_STAGE):
            return
        record = {"ok": result.ok, "stage": result.stage, "error": result.error, "seconds": result.seconds}
        self.records.put(key, record)


def _valid(found: dict[str, Any]) -> bool:
    return (
        isinstance(found.get("ok"), bool)
        and isinstance(found.get("stage"), str)
        and isinstance(found.get("error"), str)
        and isinstance(found.get("seconds"), (int, float))
    )
