"""Where the payloads of a context binary go: each distinct payload once, at a free or a requested offset.

An entry may ask for an absolute offset (``ContextBinaryWriter.add(..., offset=...)``): a backend that records
file offsets at compile time (weights it reads back from the binary's file, memory-mapped) lays its data out
before the binary exists. Identical payloads are stored once, at the first offset one of them asked for. A
request is honored when the offset is a multiple of the alignment, lies past the header and does not
overlap an earlier-honored request (requests are taken in offset order, then in the order added); otherwise
the payload is placed as if it had asked for nothing. The other payloads go in the
order added, each at the first aligned offset past the previous one that no honored request occupies (so
small ones fill the room between the header and the requested offsets).

The reader accepts any placement that keeps payloads aligned, past the header and apart, with the file ending
at the last payload (``check_layout``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from epctx.ep._alignment import align, same_bytes
from epctx.errors import InvalidGraph

__all__ = ["EntryInfo", "Slot", "check_layout", "deduplicate", "place"]


@dataclass(frozen=True, slots=True)
class EntryInfo:
    """One entry of a context binary. ``offset`` is absolute in the file; deduplicated entries share it."""

    name: str
    kind: str
    offset: int
    size: int
    checksum: str
    attrs: Mapping[str, str]


@dataclass(slots=True)
class Slot:
    """One stored payload, shared by the entries whose bytes are identical."""

    data: memoryview
    checksum: str
    wanted: int | None  # requested absolute offset


def deduplicate(payloads: Sequence[tuple[memoryview, str, int | None]]) -> tuple[list[Slot], list[int]]:
    """(data, checksum, requested offset) per entry -> the distinct slots and each entry's slot. Identical
    bytes share a slot, which takes the first offset one of them asked for."""
    slots: list[Slot] = []
    by_key: dict[tuple[int, str], list[int]] = {}
    slot_of: list[int] = []
    for data, checksum, wanted in payloads:
        candidates = by_key.setdefault((data.nbytes, checksum), [])
        slot = next((i for i in candidates if same_bytes(slots[i].data, data)), None)
        if slot is None:
            slot = len(slots)
            slots.append(Slot(data, checksum, None))
            candidates.append(slot)
        if data.nbytes and slots[slot].wanted is None:  # an empty payload occupies nothing
            slots[slot].wanted = wanted
        slot_of.append(slot)
    return slots, slot_of


def place(slots: Sequence[Slot], data_start: int, alignment: int) -> tuple[list[int], int]:
    """Each slot's offset when payloads may start at ``data_start``, and the file size. Linear in the slots
    and requests (after sorting the requests): free payloads only move forward past the honored ones."""
    honored: list[tuple[int, int]] = []  # (start, end) of honored requests, in offset order
    offsets: list[int | None] = [None] * len(slots)
    requests = sorted((s.wanted, i) for i, s in enumerate(slots) if s.wanted is not None)
    for wanted, i in requests:
        free = wanted >= (honored[-1][1] if honored else data_start)
        if free and wanted % alignment == 0:
            honored.append((wanted, wanted + slots[i].data.nbytes))
            offsets[i] = wanted
    cursor, first = data_start, 0  # honored[:first] end at or before the offsets still to come
    for i, slot in enumerate(slots):
        if offsets[i] is not None:
            continue
        size = slot.data.nbytes
        offset = align(cursor, alignment) if size else cursor
        if size:
            while first < len(honored) and honored[first][1] <= offset:
                first += 1
            for start, end in honored[first:]:
                if start >= offset + size:  # this request and every later one lie past the payload
                    break
                if offset < end:
                    offset = align(end, alignment)
        offsets[i] = offset
        cursor = offset + size
    placed = [o for o in offsets if o is not None]
    return placed, max([cursor, *(end for _, end in honored)])


def check_layout(
    entries: Mapping[str, EntryInfo], buf: memoryview, where: str, header_end: int, alignment: int
) -> dict[int, int]:
    """Reject overlapping payloads (entries may share a payload only with the same offset, size and checksum)
    and a file that goes on past its last payload; return payload offset -> start of the padding before it.
    One sort, no payload or padding read: the padding before a payload is checked when it is first read.

    A binary ends with its last payload, or with less than ``alignment`` zero bytes after the header when it
    holds no payload (what the writer leaves), so a file padded to any size is refused here without reading
    that padding."""
    by_offset: dict[int, EntryInfo] = {}
    for info in entries.values():
        if not info.size:
            continue
        first = by_offset.setdefault(info.offset, info)
        if (first.size, first.checksum) != (info.size, info.checksum):
            raise InvalidGraph(
                f"{where}: entries {first.name!r} and {info.name!r} overlap at offset {info.offset}"
            )
    gap_before: dict[int, int] = {}
    end, previous = header_end, None
    for offset in sorted(by_offset):
        info = by_offset[offset]
        if offset < end:
            raise InvalidGraph(
                f"{where}: entries {previous!r} and {info.name!r} overlap (offset {offset} < end {end})"
            )
        gap_before[offset] = end
        end, previous = offset + info.size, info.name
    tail = buf.nbytes - end
    last = "the header" if previous is None else f"the last payload ({previous!r})"
    if tail >= (alignment if previous is None else 1):
        raise InvalidGraph(
            f"{where}: {tail} bytes ({end}..{buf.nbytes}) follow {last}; a context binary ends with its last "
            "payload (padded or corrupt binary)"
        )
    if np.frombuffer(buf[end:], np.uint8).any():
        raise InvalidGraph(f"{where}: bytes {end}..{buf.nbytes} after {last} are not zero (corrupt binary)")
    return gap_before
