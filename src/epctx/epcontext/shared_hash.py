"""One pass over a context binary for both its checks: the trust policy's SHA-256 of the whole file and the
container's own checks of every entry (checksum, zero padding).

The trust policy (``epctx.trust``) hashes every file it verifies before any EP sees a byte; a session then reads
the binary's entries, each verified against its checksum on first read. Both read every byte. Here the file is
read once, a piece at a time into one buffer that stays in cache (no page of it is mapped): each piece goes to
SHA-256 and, where it belongs to a payload, to that payload's checksum stream (xxh3 costs a fraction of SHA-256
on bytes already in cache); the padding before each payload is checked zero. The payloads found intact are
remembered for this file version (``checksums.remember_verified``), so the session's reads skip them while the
file is unchanged. The loader hands ``sha256_verifying`` to the trust check (``epcontext/load.py``); the trust
layer, below this one, never imports it."""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

from epctx.epcontext.checksums import STREAMS, FileVersion, file_version, remember_verified
from epctx.epcontext.container import ContextBinary
from epctx.epcontext.header import MAGIC, PREAMBLE
from epctx.errors import InvalidGraph, Untrusted

__all__ = ["sha256_verifying"]

_PIECE = 1 << 20  # bytes read and hashed by both at a time (stays in L2)
_PREADV = hasattr(os, "preadv")  # elsewhere: the trust check hashes plainly, the container verifies on read


class _Run:
    """A run of the file: a payload (its checksum stream) or the zero padding before one (``stream`` None)."""

    __slots__ = ("end", "payload", "start", "stream")  # a plain class: cheaper to define than a dataclass

    def __init__(self, start: int, end: int, payload: tuple[int, int, str], stream: Any = None) -> None:
        self.start, self.end = start, end
        self.payload = payload  # (offset, size, checksum) of the payload it is or precedes
        self.stream = stream


def sha256_verifying(
    mapping: mmap.mmap, fd: int, version: FileVersion, path: str
) -> tuple[str, list[list[object]]] | None:
    """The SHA-256 (hex) of the whole file (``fd``; ``mapping`` maps it: only its header is read there), its
    entries verified in the same pass, and the payloads found intact ([offset, size, checksum], remembered for
    this version; the trust check keeps them in its record); None when it is not a context binary whose header
    reads (the caller hashes it plainly; the container refuses it later)."""
    if not _PREADV:
        return None
    with memoryview(mapping) as whole:
        if whole.nbytes < PREAMBLE.size or whole[: len(MAGIC)] != MAGIC:
            return None
    try:
        binary = ContextBinary(memoryview(mapping), where=f"context binary {path!r}")
    except InvalidGraph:
        return None
    try:
        runs = _runs(binary)
    finally:
        binary.close()
    digest, bad = _pass(fd, len(mapping), runs, path)
    intact = sorted({run.payload for run in runs if run.stream is not None and run.payload not in bad})
    if not intact or file_version(path) != version:  # changed while it was read: nothing to vouch for
        return digest, []
    remember_verified(version, intact)
    return digest, [list(payload) for payload in intact]


def _runs(binary: ContextBinary) -> list[_Run]:
    """The payloads and their padding, in file order (``check_layout`` made them apart)."""
    payloads = sorted({(i.offset, i.size, i.checksum) for i in map(binary.entry, binary.names()) if i.size})
    runs = []
    for payload in payloads:
        offset, size, _ = payload
        gap = binary._gap_before.get(offset, offset)
        if gap < offset:
            runs.append(_Run(gap, offset, payload))
        runs.append(_Run(offset, offset + size, payload, STREAMS[binary.checksum_algorithm]()))
    return runs


def _pass(fd: int, size: int, runs: list[_Run], path: str) -> tuple[str, set[tuple[int, int, str]]]:
    """(SHA-256 of the file's ``size`` bytes, the payloads whose padding is not zero or checksum is wrong)."""
    import hashlib  # here: its import costs more than a warm session's whole check (imported only to hash)

    sha = hashlib.sha256()
    bad: set[tuple[int, int, str]] = set()
    buffer = bytearray(_PIECE)
    position, k = 0, 0
    with memoryview(buffer) as view:
        while position < size:
            got = os.preadv(fd, [view[: min(_PIECE, size - position)]], position)
            if got <= 0:
                raise Untrusted(f"{path!r} shrank while it was hashed ({position} of {size} bytes read)")
            piece = view[:got]
            sha.update(piece)
            end = position + got
            while k < len(runs) and runs[k].start < end:
                run = runs[k]
                part = piece[max(run.start, position) - position : min(run.end, end) - position]
                if run.stream is not None:
                    run.stream.update(part)
                elif np.frombuffer(part, np.uint8).any():
                    bad.add(run.payload)
                if run.end > end:
                    break
                if run.stream is not None and run.stream.hexdigest() != run.payload[2]:
                    bad.add(run.payload)
                k += 1
            position = end
    return sha.hexdigest(), bad
