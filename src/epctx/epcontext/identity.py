"""The identity of the payload an EPContext node needs, so a context model runs only the binary it was made with.

A node's identity is a digest over the entries of its graph in the context binary (their names below the
graph, kinds, sizes, payload checksums and attributes), recorded at generation in the extra attribute
``epctx_payload_identity`` (ONNX Runtime's EPContext schema allows extra attributes) and recomputed from the
binary's header at load. The header's checksums cover every payload byte, so a binary regenerated with other
options, another model's binary under the same name or a binary of a later generation gives another identity;
a byte-identical regeneration gives the same. Offsets are left out: the graphs of a sharing group move when
later models add theirs, and the payloads they name stay the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

import xxhash

__all__ = ["IDENTITY_ATTRIBUTE", "SOURCE_FILES_KEY", "graph_identity"]

IDENTITY_ATTRIBUTE = "epctx_payload_identity"
# Model metadata: the source the context was compiled from, bound by digest (JSON [[location, size, xxh3-128]],
# the .onnx first, then its external data files): what a stale context heals from (epctx.cache.heal).
SOURCE_FILES_KEY = "epctx.source_files"
_SCHEME = "xxh3_128"


def graph_identity(
    graph_name: str, entries: Iterable[tuple[str, str, int, str, Mapping[str, str]]], checksum_algorithm: str
) -> str:
    """``entries``: (name, kind, size, checksum, attrs) of the binary's entries; those under ``graph_name/``
    count. The result names its scheme: ``xxh3_128:<32 hex digits>``."""
    prefix = f"{graph_name}/"
    rows = sorted(
        [name[len(prefix) :], kind, size, checksum, sorted(attrs.items())]
        for name, kind, size, checksum, attrs in entries
        if name.startswith(prefix)
    )
    text = json.dumps([checksum_algorithm, rows], separators=(",", ":"), ensure_ascii=False)
    return f"{_SCHEME}:{xxhash.xxh3_128_hexdigest(text.encode('utf-8', 'surrogatepass'))}"
