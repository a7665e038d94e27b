"""The measured rule's verdicts kept between processes (``epctx.partition.measured``): a session without a context
model would compile and measure its partitions again each time (ppocr_det's second session took 22 s, minilm's
compiled an IREE partition only to hand it back). The verdicts of a session, the nodes refused to each compiling
EP (its hand-backs, and the nodes refused because the EP claimed them only after a hand-back) and the node sets
of the partitions each EP kept, nodes by their position in the loaded graph (named or not), are kept in the user's cache (``epctx.ep.RecordCache`` in
``<cache>/measured-verdicts``, ``epctx.ep.user_cache_dir``). A later session with the same key refuses those nodes
to those EPs before partitioning, as a context model's record is read (``recorded_refusals``), with the reason
prefixed ``FROM_CACHE`` ("from the measured cache: "): they are neither compiled nor measured; a partition whose
node set was kept is compiled and not measured again. A partition the record does not know (an unnamed node in
it, say) is measured as before, and the record written again.

The key (``verdict_key``) is a digest of everything a verdict depends on:

- the loaded graph (``graph_digest``), after free-dimension and initializer overrides and the graph passes: its
  nodes, attributes, value types and shapes (the sizes measured), initializer bytes, opsets and functions;
- each EP in order: its name, provider options, and for a compiling EP its SDK version, hardware and
  compatibility string; the EP's code (its folder under ``epctx/providers``: its modules and the native libraries
  built there, as the CPU EP's kernels; else its module);
- the kernel EP the partitions are timed against, ``intra_op_num_threads``, the optimization level, the session
  config entries that can change a partition (those about writing contexts, caches, trust and the rule's own
  switch are left out: ``epctx.session.measured_rule``);
- this machine's CPU (``epctx.ep.cpu_device``: model name, vendor, family, model, stepping, logical cores,
  architecture; no host name), epctx's version and the sources of the rule (``measured``, ``synthetic``, this
  module).

A record that cannot be read, or is not of this form, is ignored with a warning (the session measures, and
writes it again); a cache folder that cannot be written costs a warning once. Set ``EPCTX_MEASURED_CACHE=0`` to
neither read nor write the records (as ``EPCTX_IREE_PROBE_CACHE=0`` does for IREE's probes)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
import xxhash

from epctx.ep import EPCTX_VERSION, RecordCache, cpu_device, user_cache_dir
from epctx.ep._contract import ExecutionProvider
from epctx.partition.measured import FROM_CACHE, FROM_CONTEXT

__all__ = [
    "ENABLE_ENV",
    "FROM_CACHE",
    "VerdictCache",
    "Verdicts",
    "graph_digest",
    "node_positions",
    "verdict_key",
]

logger = logging.getLogger("epctx")

ENABLE_ENV = "EPCTX_MEASURED_CACHE"
FOLDER = "measured-verdicts"
_FORMAT = 2
_RULE_MODULES = ("measured.py", "synthetic.py", "verdicts.py")


@dataclasses.dataclass(frozen=True, slots=True)
class Verdicts:
    """``refused``: EP -> node -> reason (without a prefix); ``kept``: EP -> the node sets of its partitions that
    were kept. Nodes by their position in the loaded graph's order (``node_positions``): the key holds the graph's
    digest, so a position names the same node in every session of that key, named or not (nudenet's and
    ppocr_det's unnamed nodes would be offered to the EP again, and its capability search would run again)."""

    refused: Mapping[str, Mapping[int, str]]
    kept: Mapping[str, frozenset[tuple[int, ...]]]

    @classmethod
    def of(
        cls,
        graph: ir.Graph,
        refused: Mapping[Any, tuple[str, str]],
        kept: Iterable[tuple[str, Sequence[Any]]],
    ) -> Verdicts:
        """From a session's refusals (node -> (EP, reason); those read from a context model left out: the context
        records them) and its kept partitions ((EP, nodes) each)."""
        where = node_positions(graph)
        by_ep: dict[str, dict[int, str]] = {}
        for node, (ep, why) in refused.items():
            if node in where and not why.startswith(FROM_CONTEXT):
                by_ep.setdefault(ep, {})[where[node]] = why.removeprefix(FROM_CACHE)
        sets: dict[str, set[tuple[int, ...]]] = {}
        for ep, nodes in kept:
            found = _positions(nodes, where)
            if found is not None:
                sets.setdefault(ep, set()).add(found)
        return cls(by_ep, {ep: frozenset(found) for ep, found in sets.items()})

    def refusals(self, graph: ir.Graph) -> dict[ir.Node, tuple[str, str]]:
        """node of ``graph`` -> (EP, ``FROM_CACHE`` + reason)."""
        nodes = list(graph)
        refused = {
            nodes[k]: (ep, FROM_CACHE + why)
            for ep, by_position in self.refused.items()
            for k, why in by_position.items()
            if 0 <= k < len(nodes)
        }
        kept = sum(len(sets) for sets in self.kept.values())
        logger.info(
            "measured rule: verdicts read from the measured cache: %d node(s) refused, %d partition(s) kept before",
            len(refused),
            kept,
        )
        return refused

    def was_kept(self, ep: str, nodes: Sequence[Any], where: Mapping[Any, int]) -> bool:
        """Whether ``ep`` kept a partition of exactly ``nodes`` (measured then, not to be measured again);
        ``where``: ``node_positions`` of the graph."""
        found = _positions(nodes, where)
        return found is not None and found in self.kept.get(ep, frozenset())

    def to_json(self) -> dict[str, Any]:
        reasons = sorted({why for by_position in self.refused.values() for why in by_position.values()})
        index = {why: k for k, why in enumerate(reasons)}
        refused = {
            ep: sorted([k, index[why]] for k, why in by_position.items())
            for ep, by_position in self.refused.items()
        }
        kept = {ep: sorted(list(found) for found in sets) for ep, sets in self.kept.items()}
        return {"format": _FORMAT, "reasons": reasons, "refused": refused, "kept": kept}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Verdicts:
        """ValueError when ``doc`` is not a record of this form."""
        reasons, refused, kept = doc.get("reasons"), doc.get("refused"), doc.get("kept")
        if doc.get("format") != _FORMAT or not isinstance(reasons, list) or not isinstance(refused, dict):
            raise ValueError("not a record of measured verdicts (format, reasons, refused, kept)")
        if not isinstance(kept, dict) or not all(isinstance(why, str) for why in reasons):
            raise ValueError("not a record of measured verdicts (format, reasons, refused, kept)")
        by_ep: dict[str, dict[int, str]] = {}
        for ep, pairs in refused.items():
            if not isinstance(pairs, list) or not all(
                _ints(pair, 2) and pair[1] < len(reasons) for pair in pairs
            ):
                raise ValueError(f"refused[{ep!r}] is not a list of [node, reason] positions")
            by_ep[str(ep)] = {int(k): reasons[int(why)] for k, why in pairs}
        sets: dict[str, frozenset[tuple[int, ...]]] = {}
        for ep, lists in kept.items():
            if not isinstance(lists, list) or not all(_ints(found) for found in lists):
                raise ValueError(f"kept[{ep!r}] is not a list of node-position lists")
            sets[str(ep)] = frozenset(tuple(found) for found in lists)
        return cls(by_ep, sets)


def node_positions(graph: ir.Graph) -> dict[Any, int]:
    """node -> its position in ``graph``'s order."""
    return {node: k for k, node in enumerate(graph)}


def _positions(nodes: Sequence[Any], where: Mapping[Any, int]) -> tuple[int, ...] | None:
    """The sorted positions of ``nodes``; None when one is not a node of the graph."""
    found = [where.get(node) for node in nodes]
    return None if any(k is None for k in found) else tuple(sorted(k for k in found if k is not None))


def _ints(items: Any, length: int | None = None) -> bool:
    return (
        isinstance(items, list)
        and (length is None or len(items) == length)
        and all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in items)
    )


class VerdictCache:
    """The records of verdicts by key in the user's cache (see the module); ``enabled``: ``EPCTX_MEASURED_CACHE``
    is not ``0``."""

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        self.enabled = os.environ.get(ENABLE_ENV, "1") not in ("0", "")
        self.records = RecordCache(folder or user_cache_dir(FOLDER), what="measured rule verdicts")

    def get(self, key: str, *, warn: bool = True) -> Verdicts | None:
        """The verdicts kept under ``key``; None when off, none are kept, or the record is unreadable (warned
        unless ``warn`` is false: read a second time)."""
        if not self.enabled:
            return None
        found = self.records.get(key)
        if found is None:
            path = self.records.path(key)
            if warn and path.is_file():
                logger.warning(
                    "measured rule: %s is not a record of verdicts, ignored (measured again)", path
                )
            return None
        try:
            return Verdicts.from_json(found)
        except ValueError as exc:
            if warn:
                logger.warning("measured rule: %s ignored (measured again): %s", self.records.path(key), exc)
            return None

    def put(self, key: str, verdicts: Verdicts) -> None:
        if self.enabled:
            self.records.put(key, verdicts.to_json())


def verdict_key(
    model: ir.Model,
    providers: Sequence[ExecutionProvider],
    *,
    kernel_ep: str,
    threads: int,
    level: int,
    settings: Mapping[str, str],
) -> str:
    """The key of the verdicts of a session over ``model`` (see the module); ``settings``: the session config
    entries that can change a partition."""
    parts = {
        "format": _FORMAT,
        "rule": _rule_version(),
        "graph": graph_digest(model),
        "providers": [_provider_part(ep) for ep in providers],
        "kernel_ep": kernel_ep,
        "threads": int(threads),
        "level": int(level),
        "settings": dict(sorted(settings.items())),
        "machine": _machine(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _provider_part(ep: ExecutionProvider) -> dict[str, Any]:
    part: dict[str, Any] = {"name": ep.name, "options": dict(sorted(ep.provider_options().items()))}
    if ep.compiles:
        part.update(sdk=ep.sdk_version(), hardware=ep.hardware(), compatibility=ep.compatibility_info())
    part["code"] = _code_digest(type(ep))
    return part


# An EP's code: its modules and the native libraries built into its folder (the CPU EP's kernels,
# ``providers/cpu/_native*.so``: a rebuilt library changes the kernel EP's speed, which a verdict was taken against).
_CODE_SUFFIXES = frozenset({".py", ".so", ".pyd", ".dylib"})


@functools.cache
def _code_digest(cls: type) -> str:
    """The code of an EP: its folder's modules and native libraries (recursively) when it is one of
    ``epctx.providers``, else its module's file ("" when it has none)."""
    try:
        path = Path(inspect.getfile(cls)).resolve()
    except (TypeError, OSError):
        return ""
    if cls.__module__.startswith("epctx.providers."):
        # its folder: the Python and the native code built there
        files = sorted(p for p in path.parent.rglob("*") if p.suffix in _CODE_SUFFIXES and p.is_file())
    else:
        files = [path]
    digest = xxhash.xxh3_128()
    for file in files:
        digest.update(str(file.relative_to(path.parent)).encode() + b"\0")
        digest.update(file.read_bytes())
    return digest.hexdigest()


@functools.cache
def _rule_version() -> str:
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256(EPCTX_VERSION.encode())
    for name in _RULE_MODULES:
        digest.update((here / name).read_bytes())
    return f"{EPCTX_VERSION}+{digest.hexdigest()[:16]}"


@functools.cache
def _machine() -> dict[str, Any]:
    cpu = cpu_device()
    return {"vendor": cpu.vendor, "vendor_id": cpu.vendor_id, "device_id": cpu.device_id, **cpu.metadata}


def graph_digest(model: ir.Model) -> str:
    """A digest of the loaded model's graphs (see the module): two models with the same digest partition, compile
    and run alike."""
    digest = xxhash.xxh3_128()
    digest.update(repr(sorted(model.opset_imports.items())).encode())
    _graph(digest, model.graph)
    for function in model.functions.values():
        digest.update(f"function {function.identifier()}".encode())
        for node in function:
            _node(digest, node)
    return digest.hexdigest()


def _graph(digest: Any, graph: ir.Graph) -> None:
    for kind, values in (("in", graph.inputs), ("out", graph.outputs)):
        digest.update(f"{kind} {[_value(v) for v in values]}".encode())
    for _name, value in sorted(graph.initializers.items()):
        digest.update(f"init {_value(value)}".encode())
        if value.const_value is not None:
            _tensor(digest, value.const_value)
    for node in graph:
        _node(digest, node)


def _node(digest: Any, node: ir.Node) -> None:
    inputs = [v.name if v is not None else "" for v in node.inputs]
    outputs = [_value(v) for v in node.outputs]
    digest.update(
        f"node {node.domain}:{node.op_type}:{node.overload} {node.name} {inputs} {outputs}".encode()
    )
    for name, attr in sorted(node.attributes.items()):
        value = attr.value
        digest.update(f"attr {name} {attr.type}".encode())
        if isinstance(value, ir.Graph):
            _graph(digest, value)
        elif isinstance(value, Sequence) and value and isinstance(value[0], ir.Graph):
            for body in value:
                _graph(digest, body)
        elif hasattr(value, "dtype") and hasattr(value, "tobytes"):  # a tensor
            _tensor(digest, value)
        else:
            digest.update(repr(value).encode())


def _value(value: ir.Value) -> str:
    return f"{value.name}:{value.dtype}{value.shape}"


def _tensor(digest: Any, tensor: Any) -> None:
    """The tensor's bytes, hashed in place where numpy can view them (an external tensor is mapped, not copied)."""
    digest.update(f"{tensor.dtype}{list(tensor.shape)}".encode())
    try:
        array = np.asarray(tensor.numpy())
        if array.dtype == object:
            raise TypeError("strings")
        digest.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)
    except (TypeError, ValueError, AttributeError):
        digest.update(tensor.tobytes())
