"""What an IREE partition stores in the context binary, and how it is loaded back without compiling.

Entries of one graph (``<graph name>/<key>``):

- ``meta`` (JSON document): the partition's input and output names in order, the parameters (entry key, IREE
  parameter key) and the target's ``hardware_architecture``;
- ``module`` (kind ``graph``): the ``.vmfb``, code only;
- ``params/<j>`` (kind ``weights``): one weight each, as raw bytes; the container stores identical bytes
  once, which is how the models of a sharing group share them. A weight stored in another layout than the source
  initializer's (a conv filter stored channels-last at compile, so loading transposes nothing) has the attribute
  ``transposed`` (the permutation of the source array, e.g. ``2,3,1,0``), and ``meta`` lists it under
  ``transposed`` (parameter key -> permutation): such a weight cannot be mapped from the source model's data.

Weightless (``ep.enable_weightless_mode`` 1 / 2; format version 2): the weights found unchanged in the source's
files are not entries: ``meta`` lists them as ``external`` (IREE parameter key, source file number, offset,
length) with the ``sources`` they lie in, each bound by size and digest (``epctx.ep._weightless``); loading maps
those files and IREE's parameters point straight into them. The others (internal initializers in mode 1, weights
a compile transformed) stay ``params/<j>`` entries.

Loading wraps the ``module`` entry's memory (the mapped ``.bin``) as the IREE module and serves the parameters
from the mapping (:class:`~epctx.providers.iree.params.Parameters`): nothing is copied.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from epctx.ep import ContextReader, ContextWriter, SourceFile, WeightRef, dump_document, load_document
from epctx.errors import InvalidGraph
from epctx.providers.iree.refit_record import RefitRecord

__all__ = ["FORMAT", "FORMAT_VERSION", "Meta", "read_meta", "write_entries"]

FORMAT = "epctx.iree"
FORMAT_VERSION = 1
WEIGHTLESS_VERSION = 2  # meta with 'external' and 'sources' (read by this epctx, refused by older ones)


@dataclasses.dataclass(frozen=True, slots=True)
class Meta:
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: tuple[tuple[str, str], ...]  # (entry key, IREE parameter key)
    hardware: str
    external: tuple[tuple[str, WeightRef], ...] = ()  # IREE parameter key -> where in the sources
    sources: tuple[SourceFile, ...] = ()
    refit: RefitRecord | None = None  # what the code depends on (refit checks it)
    # IREE parameter key -> permutation of the source initializer (weights not stored as in the source)
    transposed: dict[str, list[int]] = dataclasses.field(default_factory=dict)

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "params": [list(p) for p in self.params],
            "hardware": self.hardware,
        }
        if self.refit is not None:
            doc["refit"] = self.refit.to_json()
        if self.transposed:
            doc["transposed"] = self.transposed
        if not self.sources:
            return dump_document(doc, format=FORMAT, version=FORMAT_VERSION)
        doc["external"] = [[key, r.file, r.offset, r.length] for key, r in self.external]
        doc["sources"] = [f.to_json() for f in self.sources]
        return dump_document(doc, format=FORMAT, version=WEIGHTLESS_VERSION)


def _strings(value: Any, what: str, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidGraph(f"{where}: 'meta' field {what!r} must be a list of strings, found {value!r}")
    return tuple(value)


def read_meta(source: ContextReader, where: str) -> Meta:
    for key in ("meta", "module"):
        if key not in source:
            raise InvalidGraph(f"{where}: the binary has no {key!r} entry for this graph")
    data = source.read("meta")
    version = WEIGHTLESS_VERSION if b'"sources"' in bytes(data) else FORMAT_VERSION
    doc = load_document(data, format=FORMAT, version=version, where=f"{where} 'meta'")
    params = doc.get("params")
    if not isinstance(params, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in params
    ):
        raise InvalidGraph(f"{where}: 'meta' field 'params' must be [entry key, parameter key] pairs")
    for entry, _ in params:
        if entry not in source:
            raise InvalidGraph(f"{where}: parameter entry {entry!r} named in 'meta' is not in the binary")
    hardware = doc.get("hardware")
    if not isinstance(hardware, str):
        raise InvalidGraph(f"{where}: 'meta' field 'hardware' must be a string, found {hardware!r}")
    sources, external = _weightless(doc, where)
    transposed = doc.get("transposed", {})
    if not isinstance(transposed, dict) or not all(
        isinstance(v, list) and all(isinstance(i, int) for i in v) for v in transposed.values()
    ):
        raise InvalidGraph(f"{where}: 'meta' field 'transposed' must map parameter keys to permutations")
    return Meta(
        inputs=_strings(doc.get("inputs"), "inputs", where),
        outputs=_strings(doc.get("outputs"), "outputs", where),
        params=tuple((str(a), str(b)) for a, b in params),
        hardware=hardware,
        external=external,
        sources=sources,
        refit=RefitRecord.from_json(doc["refit"], where) if "refit" in doc else None,
        transposed={str(k): list(v) for k, v in transposed.items()},
    )


def _weightless(
    doc: dict[str, Any], where: str
) -> tuple[tuple[SourceFile, ...], tuple[tuple[str, WeightRef], ...]]:
    if "sources" not in doc:
        return (), ()
    raw_sources, raw_external = doc.get("sources"), doc.get("external")
    if not isinstance(raw_sources, list) or not isinstance(raw_external, list):
        raise InvalidGraph(f"{where}: 'meta' fields 'sources' and 'external' must be lists")
    sources = tuple(SourceFile.from_json(s, where) for s in raw_sources)
    external = []
    for item in raw_external:
        ok = isinstance(item, list) and len(item) == 4 and isinstance(item[0], str)
        if not ok or not all(isinstance(v, int) and v >= 0 for v in item[1:]) or item[1] >= len(sources):
            raise InvalidGraph(f"{where}: 'meta' field 'external' holds a malformed reference {item!r}")
        if item[2] + item[3] > sources[item[1]].size:
            raise InvalidGraph(
                f"{where}: weight {item[0]!r} lies past the end of {sources[item[1]].location!r}"
            )
        external.append((item[0], WeightRef(item[1], item[2], item[3])))
    return sources, tuple(external)


def write_entries(
    store: ContextWriter,
    *,
    vmfb: Any,
    weights: Sequence[tuple[str, Any]],
    inputs: Sequence[str],
    outputs: Sequence[str],
    hardware: str,
    refs: Sequence[WeightRef | None] = (),
    sources: Sequence[SourceFile] = (),
    refit: RefitRecord | None = None,
    transposed: Mapping[str, Sequence[int]] | None = None,
) -> None:
    """Store a compiled partition: ``weights`` are (IREE parameter key, C-contiguous array); a weight with a
    reference in ``refs`` (weightless mode) is recorded as such instead of stored; ``transposed``: the keys of
    weights stored in another layout than the source's, with the permutation (never mapped from the source)."""
    layouts = {k: [int(i) for i in v] for k, v in (transposed or {}).items()}
    params = []
    external = []
    found = list(refs) or [None] * len(weights)
    for j, ((key, array), ref) in enumerate(zip(weights, found, strict=True)):
        if ref is not None:
            external.append((key, ref))
            continue
        entry = f"params/{j}"
        attrs = {"parameter": key}
        if key in layouts:
            attrs["transposed"] = ",".join(map(str, layouts[key]))
        store.add(entry, array, kind="weights", attrs=attrs)
        params.append((entry, key))
    store.add("module", vmfb, kind="graph")
    used = tuple(sources) if external else ()
    meta = Meta(
        tuple(inputs),
        tuple(outputs),
        tuple(params),
        hardware,
        tuple(external),
        used,
        refit,
        transposed=layouts,
    )
    store.add("meta", meta.to_json(), kind="graph")
