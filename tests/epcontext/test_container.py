"""Context binary container: round trips, dedup, alignment, determinism, corruption, atomic writes, mmap lifetime."""

from __future__ import annotations

import array
import gc
import json
import os
import struct
import zlib
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epctx.epcontext import ContextBinary, ContextBinaryWriter
from epctx.epcontext import checksums as checksums_mod
from epctx.errors import Fail, InvalidArgument, InvalidGraph, NoSuchFile

PREAMBLE = struct.Struct("<8sIIQQ")


def _writer(**kwargs: Any) -> ContextBinaryWriter:
    fields: dict[str, Any] = dict(ep_name="ExampleEP", sdk_version="1.2.3", hardware="x86_64")
    fields.update(kwargs)
    return ContextBinaryWriter(**fields)


def _small_blob(**kwargs: Any) -> bytes:
    """A small binary with a graph, two identical weights (deduplicated), an empty entry and padding room."""
    w = _writer(metadata={"pad": "p" * 64}, **kwargs)
    w.add("graph_a", b"graph bytes for model A", attrs={"inputs": "x"})
    w.add("w0", np.arange(12, dtype=np.float32), kind="weights", attrs={"dtype": "float32"})
    w.add("w0_copy", np.arange(12, dtype=np.float32), kind="weights")
    w.add("empty", b"", kind="metadata")
    w.add("graph_b", bytes(range(70)))
    return w.to_bytes()


def _read_all(cb: ContextBinary) -> None:
    for name in cb.names():
        cb.read(name)


def _header(blob: bytes) -> tuple[dict[str, Any], int]:
    _, _, _, header_len, _ = PREAMBLE.unpack_from(blob)
    return json.loads(blob[32 : 32 + header_len]), header_len


def _rebuild(blob: bytes, header: dict[str, Any], *, magic: bytes = b"EPCTXBIN", version: int = 1) -> bytes:
    """Re-encode ``header`` in place of the original one (same length, padded with JSON whitespace, valid crc)
    so structural checks are what is tested, not the header checksum."""
    _, old_len = _header(blob)
    header.setdefault("metadata", {})["pad"] = ""
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    assert len(raw) <= old_len, "test header grew past the original"
    raw += b" " * (old_len - len(raw))
    size = len(blob)
    crc = zlib.crc32(raw, zlib.crc32(struct.pack("<QQ", old_len, size)))
    return PREAMBLE.pack(magic, version, crc, old_len, size) + raw + blob[32 + old_len :]


# --- round trips -------------------------------------------------------------------------------------------

_DTYPES = [
    np.uint8,
    np.int8,
    np.int32,
    np.int64,
    np.float16,
    np.float32,
    np.float64,
    np.bool_,
    ml_dtypes.bfloat16,
]

_entry = st.tuples(
    st.sampled_from(["graph", "weights", "metadata"]) | st.text(min_size=1, max_size=8),
    st.sampled_from(range(len(_DTYPES))),
    st.integers(0, 100 * 1024),  # bytes
    st.integers(0, 3),  # content seed: a small pool so identical payloads (dedup) happen
    st.dictionaries(st.text(max_size=6), st.text(max_size=10), max_size=3),
)


def _payload(dtype_index: int, nbytes: int, seed: int) -> np.ndarray:
    dtype = np.dtype(_DTYPES[dtype_index])
    count = nbytes // dtype.itemsize
    raw = np.random.default_rng(seed).integers(0, 256, count * dtype.itemsize, dtype=np.uint8)
    if dtype == np.bool_:
        raw &= 1
    return raw.view(dtype)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    entries=st.dictionaries(st.text(min_size=1, max_size=12), _entry, max_size=8),
    alignment=st.sampled_from([1, 8, 64, 4096]),
    checksum=st.sampled_from(["xxh3_64", "crc32"]),
    metadata=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
)
@pytest.mark.slow
def test_round_trip_random_entries(
    entries: dict[str, tuple[str, int, int, int, dict[str, str]]],
    alignment: int,
    checksum: str,
    metadata: dict[str, str],
) -> None:
    w = _writer(metadata=metadata, alignment=alignment, checksum=checksum)
    arrays = {}
    for name, (kind, dtype_index, nbytes, seed, attrs) in entries.items():
        arrays[name] = _payload(dtype_index, nbytes, seed)
        w.add(name, arrays[name], kind=kind, attrs=attrs)
    blob = w.to_bytes()
    assert blob == w.to_bytes()

    cb = ContextBinary.from_bytes(blob)
    assert (cb.ep_name, cb.sdk_version, cb.hardware) == ("ExampleEP", "1.2.3", "x86_64")
    assert dict(cb.metadata) == metadata
    assert cb.alignment == alignment and cb.checksum_algorithm == checksum
    assert cb.names() == tuple(entries)
    payloads: dict[int, bytes] = {}
    for name, (kind, dtype_index, _, _, attrs) in entries.items():
        info = cb.entry(name)
        assert (info.kind, dict(info.attrs), info.size) == (kind, attrs, arrays[name].nbytes)
        data = bytes(cb.read(name))
        assert data == arrays[name].tobytes()
        got = cb.array(name, _DTYPES[dtype_index], arrays[name].shape)
        assert got.dtype == arrays[name].dtype and got.shape == arrays[name].shape
        assert got.tobytes() == arrays[name].tobytes()
        if info.size:
            assert info.offset % alignment == 0
            assert payloads.setdefault(info.offset, data) == data
    # dedup: one stored payload per distinct non-empty content
    distinct = {a.tobytes() for a in arrays.values() if a.nbytes}
    assert len(payloads) == len(distinct)
    stored = sum(len(p) for p in payloads.values())
    assert len(blob) - stored < 32 + _header(blob)[1] + alignment * (len(payloads) + 1)


def test_file_round_trip_and_identical_output(tmp_path: Any) -> None:
    blob = _small_blob()
    for name in ("a.bin", "b.bin"):
        w = _writer(metadata={"pad": "p" * 64})
        w.add("graph_a", b"graph bytes for model A", attrs={"inputs": "x"})
        w.add("w0", np.arange(12, dtype=np.float32), kind="weights", attrs={"dtype": "float32"})
        w.add("w0_copy", np.arange(12, dtype=np.float32), kind="weights")
        w.add("empty", b"", kind="metadata")
        w.add("graph_b", bytes(range(70)))
        w.write(tmp_path / name)
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "b.bin").read_bytes() == blob
    chunks: list[bytes] = []
    w.write_to(chunks.append)
    assert all(type(c) is bytes for c in chunks) and b"".join(chunks) == blob
    with ContextBinary.open(tmp_path / "a.bin") as cb:
        assert cb.array("w0", np.float32).tolist() == list(range(12))
        assert bytes(cb.read("graph_b")) == bytes(range(70))
        assert bytes(cb.read("empty")) == b""
        assert "w0" in cb and "nope" not in cb
        assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]


def test_various_buffer_inputs() -> None:
    w = _writer()
    w.add("arr2d", np.arange(6, dtype=np.int16).reshape(2, 3))
    w.add("scalar", np.array(7.5, dtype=np.float64))
    w.add("bf16", np.array([1.0, 2.0], dtype=ml_dtypes.bfloat16))
    w.add("pyarray", array.array("f", [1.0, 2.0]))
    w.add("bytearray", bytearray(b"abc"))
    w.add("memview", memoryview(b"xyz"))
    cb = ContextBinary.from_bytes(w.to_bytes())
    assert cb.array("arr2d", np.int16, (2, 3)).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert cb.array("scalar", np.float64, ()).item() == 7.5
    assert cb.array("bf16", ml_dtypes.bfloat16).astype(np.float32).tolist() == [1.0, 2.0]
    assert cb.array("pyarray", np.float32).tolist() == [1.0, 2.0]
    assert bytes(cb.read("bytearray")) + bytes(cb.read("memview")) == b"abcxyz"


# --- dedup, alignment, determinism -------------------------------------------------------------------------


def test_identical_entries_are_stored_once() -> None:
    payload = np.random.default_rng(1).standard_normal(25_000).astype(np.float32)  # 100 KB
    one, two, other = _writer(), _writer(), _writer()
    one.add("a", payload)
    two.add("a", payload)
    two.add("b", payload.copy(), kind="weights")
    other.add("a", payload)
    other.add("b", payload + 1)
    size_one, size_two, size_other = len(one.to_bytes()), len(two.to_bytes()), len(other.to_bytes())
    assert size_two - size_one < 200  # only the second header row
    assert size_other - size_one >= payload.nbytes
    cb = ContextBinary.from_bytes(two.to_bytes())
    assert cb.entry("a").offset == cb.entry("b").offset
    assert cb.entry("b").kind == "weights"


def test_same_checksum_different_bytes_are_not_merged(monkeypatch: pytest.MonkeyPatch) -> None:
    constant = lambda data: "0" * 16  # noqa: E731 - every payload collides
    w = _writer()
    w.add("a", b"A" * 100)
    w.add("b", b"B" * 100)
    monkeypatch.setattr(checksums_mod, "CHECKSUM_ALGORITHMS", {"xxh3_64": constant})
    _, payloads = w._layout()
    assert len(payloads) == 2


@pytest.mark.parametrize("alignment", [64, 4096])
def test_payloads_are_aligned_in_memory(tmp_path: Any, alignment: int) -> None:
    w = _writer(alignment=alignment)
    for i in range(5):
        w.add(f"t{i}", np.full(i * 37 + 1, i, dtype=np.float64))
    w.write(tmp_path / "m.bin")
    with ContextBinary.open(tmp_path / "m.bin") as cb:
        for i in range(5):
            arr = cb.array(f"t{i}", np.float64)
            assert cb.entry(f"t{i}").offset % alignment == 0
            assert arr.ctypes.data % alignment == 0  # mmap base is page aligned
            assert not arr.flags.writeable
            del arr


def test_deterministic_across_writers_and_order_matters() -> None:
    def build(order: list[str]) -> bytes:
        w = _writer(metadata={"z": "1", "a": "2"})
        for name in order:
            w.add(name, name.encode() * 10, attrs={"k2": "v", "k1": "v"})
        return w.to_bytes()

    assert build(["x", "y", "z"]) == build(["x", "y", "z"])
    assert build(["x", "y", "z"]) != build(["z", "y", "x"])


# --- corruption --------------------------------------------------------------------------------------------


def test_every_single_byte_flip_is_detected() -> None:
    blob = _small_blob()
    _, header_len = _header(blob)
    header_end = 32 + header_len
    for i in range(len(blob)):
        for mask in (0x01, 0xFF):
            bad = bytearray(blob)
            bad[i] ^= mask
            try:
                cb = ContextBinary.from_bytes(bytes(bad))
            except InvalidGraph as exc:
                assert "embedded context" in str(exc)
                continue
            assert i >= header_end, f"flip at header byte {i} not detected at open"
            with pytest.raises(InvalidGraph, match="embedded context: entry '.*'") as info:
                _read_all(cb)
            msg = str(info.value)
            assert ("checksum mismatch: expected" in msg and "found" in msg) or "padding bytes" in msg


def test_payload_flip_message_and_lazy_verification(tmp_path: Any) -> None:
    blob = bytearray(_small_blob())
    cb = ContextBinary.from_bytes(bytes(blob))
    target = cb.entry("graph_b")
    blob[target.offset + 3] ^= 0x10
    path = tmp_path / "bad.bin"
    path.write_bytes(blob)
    with ContextBinary.open(path) as bad:
        assert bytes(bad.read("graph_a")) == b"graph bytes for model A"  # untouched entries still load
        with pytest.raises(InvalidGraph) as info:
            bad.read("graph_b")
        msg = str(info.value)
        assert str(path) in msg and "'graph_b'" in msg and "checksum mismatch" in msg
        assert f"expected xxh3_64 {target.checksum}" in msg and "found" in msg
        with pytest.raises(InvalidGraph):  # still raises the second time
            bad.verify()


def test_each_payload_is_verified_once(monkeypatch: pytest.MonkeyPatch) -> None:
    cb = ContextBinary.from_bytes(_small_blob())
    calls: list[int] = []
    digest = cb._digest
    monkeypatch.setattr(cb, "_digest", lambda view: calls.append(view.nbytes) or digest(view))
    for _ in range(3):
        cb.read("w0")
        cb.read("w0_copy")  # same payload: already verified
        cb.array("w0", np.float32)
    assert calls == [48]


def test_truncation_at_every_length(tmp_path: Any) -> None:
    blob = _small_blob()
    for n in range(len(blob)):
        with pytest.raises(InvalidGraph, match="embedded context"):
            ContextBinary.from_bytes(blob[:n])
    for n in (0, 5, 31, 32, 100, len(blob) - 1):
        path = tmp_path / f"t{n}.bin"
        path.write_bytes(blob[:n])
        with pytest.raises(InvalidGraph, match=str(path)):
            ContextBinary.open(path)
    with pytest.raises(InvalidGraph, match="size mismatch"):
        ContextBinary.from_bytes(blob + b"\0")


def test_wrong_magic_and_version() -> None:
    blob = _small_blob()
    header, _ = _header(blob)
    with pytest.raises(InvalidGraph, match="not an epctx context binary"):
        ContextBinary.from_bytes(_rebuild(blob, header, magic=b"EPCTXBIM"))
    with pytest.raises(InvalidGraph, match="format version 2"):
        ContextBinary.from_bytes(_rebuild(blob, header, version=2))
    with pytest.raises(InvalidGraph, match="not an epctx context binary"):
        ContextBinary.from_bytes(b"\x08\x01ONNX model bytes" * 4)


def _mutated(update: Any) -> bytes:
    blob = _small_blob()
    header, _ = _header(blob)
    update(header, {e["name"]: e for e in header["entries"]}, len(blob))
    return _rebuild(blob, header)


@pytest.mark.parametrize(
    ("update", "message"),
    [
        (lambda h, e, n: e["graph_b"].update(offset=n + 64), "runs past the end"),
        (lambda h, e, n: e["graph_b"].update(size=10**12), "runs past the end"),
        (lambda h, e, n: e["graph_b"].update(offset=-64), "non-negative integer"),
        (lambda h, e, n: e["graph_b"].update(size=True), "non-negative integer"),
        (lambda h, e, n: e["graph_b"].update(offset=64), "points into the header"),
        (lambda h, e, n: e["graph_a"].update(offset=e["graph_a"]["offset"] + 1), "not a multiple"),
        (lambda h, e, n: e["w0"].update(offset=e["graph_a"]["offset"]), "overlap"),
        (lambda h, e, n: e["graph_b"].update(offset=e["graph_b"]["offset"] - 64), "overlap"),
        (lambda h, e, n: e["w0_copy"].update(name="w0"), "appears twice"),
        (lambda h, e, n: e["graph_a"].update(attrs={"k": 1}), "attrs"),
        (lambda h, e, n: e["graph_a"].pop("kind"), "'kind' must be a string"),
        (lambda h, e, n: h.update(checksum="md4"), "unknown checksum"),
        (lambda h, e, n: h.update(alignment=48), "power of two"),
        (lambda h, e, n: h.update(metadata={"a": 5}), "metadata"),
        (lambda h, e, n: h.update(entries={}), "'entries' must be a list"),
        (lambda h, e, n: h.pop("ep_name"), "'ep_name' must be a string"),
    ],
)
def test_structural_errors(update: Any, message: str) -> None:
    with pytest.raises(InvalidGraph, match=message):
        ContextBinary.from_bytes(_mutated(update))


def test_header_not_json_or_not_utf8() -> None:
    blob = _small_blob()
    _, header_len = _header(blob)
    size = len(blob)
    for raw in (b"\xff" * header_len, b"[" * header_len, b'"x"'.ljust(header_len)):
        crc = zlib.crc32(raw, zlib.crc32(struct.pack("<QQ", header_len, size)))
        bad = PREAMBLE.pack(b"EPCTXBIN", 1, crc, header_len, size) + raw + blob[32 + header_len :]
        with pytest.raises(InvalidGraph, match="header"):
            ContextBinary.from_bytes(bad)


def test_missing_entry_lists_present_ones() -> None:
    w = _writer()
    for i in range(12):
        w.add(f"g{i}", bytes([i]))
    cb = ContextBinary.from_bytes(w.to_bytes())
    with pytest.raises(InvalidGraph, match=r"no entry 'gx' \(entries: 'g0', 'g1'.* and 4 more\)"):
        cb.read("gx")


def test_array_shape_or_dtype_mismatch() -> None:
    cb = ContextBinary.from_bytes(_small_blob())
    with pytest.raises(InvalidGraph, match="'w0' has 48 bytes, expected 40"):
        cb.array("w0", np.float32, (10,))
    with pytest.raises(InvalidGraph, match="expected"):
        cb.array("graph_b", np.float64)  # 70 bytes is not a multiple of 8
    with pytest.raises(InvalidArgument):
        cb.array("w0", object)


# --- writer validation and atomic writes -------------------------------------------------------------------


def test_writer_rejects_bad_input() -> None:
    w = _writer()
    w.add("a", b"1")
    with pytest.raises(InvalidArgument, match="'a' is already"):
        w.add("a", b"2")
    bad_calls = [
        lambda: w.add("", b"x"),
        lambda: w.add("s", "text"),
        lambda: w.add("l", [1, 2, 3]),
        lambda: w.add("o", np.array([object()])),
        lambda: w.add("nc", np.arange(10)[::2]),
        lambda: w.add("k", b"x", kind=""),
        lambda: w.add("at", b"x", attrs={"a": 1}),
        lambda: _writer(alignment=48),
        lambda: _writer(alignment=0),
        lambda: _writer(metadata={"a": 1}),
        lambda: _writer(checksum="md5"),
        lambda: _writer(ep_name=""),
    ]
    for call in bad_calls:
        with pytest.raises(InvalidArgument):
            call()
    assert w.names() == ("a",)
    w.add("bad\ud800text", b"x")  # not encodable as UTF-8: refused when the header is built
    with pytest.raises(InvalidArgument, match="not valid text"):
        w.to_bytes()
    with pytest.raises(InvalidArgument, match="not the str"):
        _writer().add_from(ContextBinary.from_bytes(_small_blob()), names="w0")


def test_failing_write_keeps_previous_file(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "model_ep.bin"
    _writer().write(path)
    before = path.read_bytes()
    w = _writer()
    w.add("big", np.zeros(3 << 20, dtype=np.uint8))

    def failing_chunks() -> Any:
        yield b"EPCTXBIN partial"
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(w, "_chunks", failing_chunks)
    with pytest.raises(RuntimeError, match="disk on fire"):
        w.write(path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["model_ep.bin"]
    with pytest.raises(RuntimeError):
        w.write(tmp_path / "new.bin")
    assert os.listdir(tmp_path) == ["model_ep.bin"]


def test_failing_fsync_leaves_nothing(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    w = _writer()
    w.add("g", b"abc")

    def no_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_fsync)
    with pytest.raises(Fail, match="No space left"):
        w.write(tmp_path / "x.bin")
    assert os.listdir(tmp_path) == []


def test_failing_stream_surfaces_as_fail() -> None:
    w = _writer()
    w.add("big", np.ones(20 << 20, dtype=np.uint8))  # several chunks
    got: list[int] = []

    def sink(chunk: bytes) -> None:
        got.append(len(chunk))
        if len(got) == 2:
            raise OSError("pipe closed")

    with pytest.raises(Fail, match="pipe closed"):
        w.write_to(sink)
    assert max(got) <= 8 << 20


def test_write_and_open_path_errors(tmp_path: Any) -> None:
    w = _writer()
    with pytest.raises(NoSuchFile):
        w.write(tmp_path / "missing" / "x.bin")
    with pytest.raises(InvalidArgument, match="folder"):
        w.write(tmp_path)
    with pytest.raises(NoSuchFile):
        ContextBinary.open(tmp_path / "nope.bin")
    with pytest.raises(InvalidArgument, match="folder"):
        ContextBinary.open(tmp_path)


# --- memory: mmap lifetime, no copies, merging -------------------------------------------------------------


@pytest.mark.slow
def test_views_outlive_the_binary(tmp_path: Any) -> None:
    path = tmp_path / "w.bin"
    w = _writer()
    w.add("w", np.arange(100_000, dtype=np.float32), kind="weights")
    w.write(path)
    cb = ContextBinary.open(path)
    arr = cb.array("w", np.float32, (1000, 100))
    view = cb.read("w")
    del cb
    gc.collect()
    assert arr.sum(dtype=np.float64) == np.arange(100_000, dtype=np.float64).sum()
    assert len(view) == 400_000
    with ContextBinary.open(path) as cb2:
        arr2 = cb2.array("w", np.float32)
    assert arr2[-1] == 99_999  # still mapped after close()
    with pytest.raises(InvalidArgument, match="closed"):
        cb2.read("w")
    cb2.close()  # idempotent
    del arr, view, arr2
    gc.collect()


def test_from_bytes_does_not_copy() -> None:
    buf = bytearray(_small_blob())
    cb = ContextBinary.from_bytes(buf)
    arr = cb.array("w0", np.float32)
    assert np.shares_memory(arr, np.frombuffer(buf, np.uint8))
    assert not arr.flags.writeable and cb.read("w0").readonly
    source = np.frombuffer(_small_blob(), np.uint8)
    assert np.shares_memory(ContextBinary.from_bytes(source).array("w0", np.float32), source)


def test_add_from_merges_and_shares_weights(tmp_path: Any) -> None:
    weights = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    first, second = _writer(), _writer()
    first.add("model1/graph", b"g1")
    first.add("model1/w", weights, kind="weights", attrs={"dtype": "float32"})
    second.add("model2/graph", b"g2")
    second.add("model2/w", weights.copy(), kind="weights")
    first.write(tmp_path / "a.bin")
    b = ContextBinary.from_bytes(second.to_bytes(), where="second")
    with ContextBinary.open(tmp_path / "a.bin") as a:
        merged = _writer(checksum="crc32")
        merged.add_from(a)
        merged.add_from(b, names=["model2/w", "model2/graph"])
        with pytest.raises(InvalidArgument, match="already"):
            merged.add_from(b, names=["model2/graph"])
        blob = merged.to_bytes()
    out = ContextBinary.from_bytes(blob)
    assert out.names() == ("model1/graph", "model1/w", "model2/w", "model2/graph")
    assert out.entry("model1/w").offset == out.entry("model2/w").offset
    assert dict(out.entry("model1/w").attrs) == {"dtype": "float32"}
    assert np.array_equal(out.array("model2/w", np.float32), weights)
    assert len(blob) < 2 * weights.nbytes

    corrupt = bytearray(second.to_bytes())
    corrupt[b.entry("model2/w").offset] ^= 1
    fresh = _writer()
    with pytest.raises(InvalidGraph, match="'model2/w'"):
        fresh.add_from(ContextBinary.from_bytes(bytes(corrupt)))
    assert fresh.names() == ()
