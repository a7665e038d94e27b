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

Loading wraps the ``module`` entry's memory (the mapped ``.bin``) as the IREE module and serves the parameters
from the mapping (:class:`~epctx.providers.iree.params.Parameters`): nothing is copied.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from epctx.ep import ContextReader, ContextWriter, dump_document, load_document
from epctx.errors import InvalidGraph

__all__ = ["FORMAT", "FORMAT_VERSION", "Meta", "read_meta", "write_entries"]

FORMAT = "epctx.iree"
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True, slots=True)
class Meta:
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: tuple[tuple[str, str], ...]  # (entry key, IREE parameter key)
    hardware: str
    # IREE parameter key -> permutation of the source initializer (weights not stored as in the source)
    transposed: dict[str, list[int]] = dataclasses.field(default_factory=dict)

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "params": [list(p) for p in self.params],
            "hardware": self.hardware,
        }
        if self.transposed:
            doc["transposed"] = self.transposed
        return dump_document(doc, format=FORMAT, version=FORMAT_VERSION)


def _strings(value: Any, what: str, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidGraph(f"{where}: 'meta' field {what!r} must be a list of strings, found {value!r}")
    return tuple(value)


def read_meta(source: ContextReader, where: str) -> Meta:
    for key in ("meta", "module"):
        if key not in source:
            raise InvalidGraph(f"{where}: the binary has no {key!r} entry for this graph")
    doc = load_document(source.read("meta"), format=FORMAT, version=FORMAT_VERSION, where=f"{where} 'meta'")
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
        transposed={str(k): list(v) for k, v in transposed.items()},
    )


def write_entries(
    store: ContextWriter,
    *,
    vmfb: Any,
    weights: Sequence[tuple[str, Any]],
    inputs: Sequence[str],
    outputs: Sequence[str],
    hardware: str,
    transposed: Mapping[str, Sequence[int]] | None = None,
) -> None:
    """Store a compiled partition: ``weights`` are (IREE parameter key, C-contiguous array); ``transposed``: the
    keys of weights stored in another layout than the source's, with the permutation."""
    layouts = {k: [int(i) for i in v] for k, v in (transposed or {}).items()}
    params = []
    for j, (key, array) in enumerate(weights):
        entry = f"params/{j}"
        attrs = {"parameter": key}
        if key in layouts:
            attrs["transposed"] = ",".join(map(str, layouts[key]))
        store.add(entry, array, kind="weights", attrs=attrs)
        params.append((entry, key))
    store.add("module", vmfb, kind="graph")
    meta = Meta(tuple(inputs), tuple(outputs), tuple(params), hardware, layouts)
    store.add("meta", meta.to_json(), kind="graph")
