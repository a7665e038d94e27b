"""Context binary entries at requested absolute offsets, and the file a binary was opened from."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epctx.epcontext import ContextBinary, ContextBinaryWriter
from epctx.errors import InvalidArgument, InvalidGraph

BASE = 8192


def _writer(**kwargs: Any) -> ContextBinaryWriter:
    return ContextBinaryWriter(ep_name="ExampleEP", sdk_version="1", hardware="hw", **kwargs)


def _offsets(blob: bytes) -> dict[str, int]:
    with ContextBinary.from_bytes(blob) as cb:
        cb.verify()
        return {name: cb.entry(name).offset for name in cb.names()}


def test_requested_offsets_are_honored_and_the_rest_fills_around() -> None:
    w = _writer()
    w.add("meta", b"m" * 100)
    w.add("w0", np.arange(1000, dtype=np.float32), kind="weights", offset=BASE)
    w.add("w1", np.ones(64, np.float32), kind="weights", offset=BASE + 4096)
    w.add("blob", bytes(range(256)) * 40)  # 10 KB: too big for the room before BASE
    w.add("small", b"s" * 10)
    blob = w.to_bytes()
    offsets = _offsets(blob)
    assert offsets["w0"] == BASE and offsets["w1"] == BASE + 4096
    assert offsets["meta"] < BASE  # small payloads fill the room between the header and BASE
    assert offsets["blob"] >= BASE + 4096 + 256  # past the requested region it does not fit before
    assert offsets["small"] > offsets["blob"]  # the others keep the order added
    with ContextBinary.from_bytes(blob) as cb:
        np.testing.assert_array_equal(cb.array("w0", np.float32), np.arange(1000, dtype=np.float32))
        assert bytes(cb.read("blob")) == bytes(range(256)) * 40
    assert blob == _writer_same().to_bytes()  # deterministic


def _writer_same() -> ContextBinaryWriter:
    w = _writer()
    w.add("meta", b"m" * 100)
    w.add("w0", np.arange(1000, dtype=np.float32), kind="weights", offset=BASE)
    w.add("w1", np.ones(64, np.float32), kind="weights", offset=BASE + 4096)
    w.add("blob", bytes(range(256)) * 40)
    w.add("small", b"s" * 10)
    return w


def test_requests_that_cannot_be_given_are_placed_like_the_others() -> None:
    w = _writer()
    w.add("in_header", b"a" * 64, offset=64)  # the header is longer than 32 bytes
    w.add("misaligned", b"b" * 64, offset=BASE + 8)
    w.add("first", b"c" * 256, offset=BASE)
    w.add("overlapping", b"d" * 64, offset=BASE + 128)  # inside "first"
    w.add("after", b"e" * 64, offset=BASE + 4096)
    offsets = _offsets(w.to_bytes())
    assert offsets["first"] == BASE and offsets["after"] == BASE + 4096
    assert offsets["in_header"] != 64 and offsets["misaligned"] != BASE + 8
    assert not BASE <= offsets["overlapping"] < BASE + 256


def test_identical_payloads_are_stored_once_at_the_first_requested_offset() -> None:
    data = np.arange(256, dtype=np.float32)
    w = _writer()
    w.add("free", data)  # no request: the slot takes the first request of an identical entry
    w.add("a", data.copy(), offset=BASE)
    w.add("b", data.copy(), offset=BASE + 4096)  # same bytes elsewhere: stored once, at BASE
    w.add("other", np.ones(64, np.float32), offset=BASE + 4096)
    blob = w.to_bytes()
    offsets = _offsets(blob)
    assert offsets["free"] == offsets["a"] == offsets["b"] == BASE
    assert offsets["other"] == BASE + 4096
    assert len(blob) == BASE + 4096 + 256


def test_a_requested_offset_past_a_long_header_moves() -> None:
    w = _writer()
    for k in range(400):  # a header of ~30 KB
        w.add(f"entry_{k:04d}_{'x' * 40}", bytes([k % 251]) * 8)
    w.add("pinned", b"p" * 64, offset=4096)
    offsets = _offsets(w.to_bytes())
    assert offsets["pinned"] > 4096


def test_offset_must_be_a_non_negative_int() -> None:
    w = _writer()
    for bad in (-64, 1.5, "64", True):
        with pytest.raises(InvalidArgument, match="offset"):
            w.add("x", b"x", offset=bad)  # type: ignore[arg-type]
    w.add("empty", b"", offset=BASE)  # an empty payload occupies nothing: the request is moot
    w.add("x", b"x")
    assert set(_offsets(w.to_bytes())) == {"empty", "x"}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # payload choice (repeats exercise deduplication)
            st.one_of(st.none(), st.integers(0, 200).map(lambda k: k * 64)),  # requested offset
        ),
        min_size=1,
        max_size=12,
    )
)
def test_random_requests_always_give_a_valid_binary(items: list[tuple[int, int | None]]) -> None:
    payloads = [b"", b"q" * 70, bytes(range(200)), b"z" * 1000]
    w = _writer()
    for k, (choice, offset) in enumerate(items):
        w.add(f"e{k}", payloads[choice], offset=offset)
    # Each distinct payload is stored once, at the first offset asked for it; 4096 is past these headers.
    requests: dict[int, int] = {}
    for choice, offset in items:
        if offset is not None and payloads[choice]:
            requests.setdefault(choice, offset)
    blob = w.to_bytes()
    with ContextBinary.from_bytes(blob) as cb:
        cb.verify()
        for k, (choice, _) in enumerate(items):
            assert bytes(cb.read(f"e{k}")) == payloads[choice]
            wanted = requests.get(choice)
            if wanted is None or wanted < 4096:
                continue
            end = wanted + len(payloads[choice])
            overlapped = any(
                c != choice and o < end and wanted < o + len(payloads[c]) for c, o in requests.items()
            )
            assert cb.entry(f"e{k}").offset == wanted or overlapped


def test_corrupted_requested_entry_is_detected(tmp_path: Path) -> None:
    w = _writer()
    w.add("weights", np.arange(4096, dtype=np.float32), kind="weights", offset=BASE)
    path = tmp_path / "b.bin"
    w.write(path)
    raw = bytearray(path.read_bytes())
    raw[BASE + 5000] ^= 0x10
    path.write_bytes(bytes(raw))
    with ContextBinary.open(path) as cb, pytest.raises(InvalidGraph, match="'weights'.*checksum mismatch"):
        cb.read("weights")


def test_path_and_open_file(tmp_path: Path) -> None:
    w = _writer()
    w.add("x", b"payload")
    path = tmp_path / "b.bin"
    w.write(path)
    with ContextBinary.open(path) as cb:
        assert cb.path == os.path.abspath(path)
        fd = cb.open_file()
        assert fd is not None
        try:
            assert os.path.samestat(os.fstat(fd), os.stat(path))
        finally:
            os.close(fd)
        w.add("y", b"more")
        w.write(path)  # replaced (a new file under the same name): not the one that was verified
        assert cb.open_file() is None
        assert bytes(cb.read("x")) == b"payload"  # the mapping still holds the old file
    with ContextBinary.from_bytes(path.read_bytes()) as cb:
        assert cb.path is None and cb.open_file() is None
    with ContextBinary.open(path) as cb:
        path.unlink()
        assert cb.open_file() is None
