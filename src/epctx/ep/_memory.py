"""Memory held by payloads that are views of memory-mapped files."""

from __future__ import annotations

import mmap

import numpy as np

from epctx.errors import InvalidArgument

__all__ = ["byte_view", "mapped_file", "release_pages"]


def mapped_file(view: memoryview) -> mmap.mmap | None:
    """The ``mmap`` a view's memory belongs to (a payload given as a view, or an array view, of a memory-mapped
    file), else None."""
    owner: object = view.obj
    for _ in range(64):  # views of views: follow the chain to the object that owns the memory
        if isinstance(owner, np.ndarray) and owner.base is not None:
            owner = owner.base
        elif isinstance(owner, memoryview):
            owner = owner.obj
        else:
            break
    return owner if isinstance(owner, mmap.mmap) and not owner.closed else None


def release_pages(view: memoryview) -> None:
    """Drop the pages of ``view`` from this process's resident memory when it is a view of a memory-mapped
    file (a payload streamed to a file, an entry of an opened binary): the data stays in the file and is read
    again if touched, so nothing changes but the memory held. Writing or hashing a payload larger than memory
    this way holds one chunk at a time, as a stream would. Anything else is left alone."""
    owner = mapped_file(view)
    if owner is None or view.nbytes < mmap.PAGESIZE:
        return
    with memoryview(owner) as whole:
        if not whole.readonly:  # private or anonymous writable memory: dropping pages would lose data
            return
    try:
        base = np.frombuffer(owner, np.uint8).ctypes.data
        start = np.frombuffer(view, np.uint8).ctypes.data - base
        first = start // mmap.PAGESIZE * mmap.PAGESIZE
        end = min(start + view.nbytes, len(owner))
        owner.madvise(mmap.MADV_DONTNEED, first, end - first)
    except (AttributeError, OSError, ValueError):  # no madvise here, or the mapping went away: keep the pages
        pass


def byte_view(data: object, what: str) -> memoryview:
    """A flat unsigned-byte view of ``data`` without copying it; ``what`` names it in errors."""
    if isinstance(data, np.ndarray):
        if data.dtype.hasobject:
            raise InvalidArgument(f"{what}: arrays of Python objects cannot be stored")
        if not data.flags.c_contiguous:
            raise InvalidArgument(f"{what}: the array is not C-contiguous (pass np.ascontiguousarray(data))")
        return memoryview(data.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
    try:
        view = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgument(
            f"{what}: expected bytes-like data or a numpy array, not {type(data).__name__}"
        ) from None
    if not view.c_contiguous:
        raise InvalidArgument(f"{what}: the buffer is not C-contiguous")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")
