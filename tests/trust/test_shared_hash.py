"""One pass serves the trust policy's SHA-256 and the container's own checks: a context binary the trust check
hashed is not hashed again by the container's checksum pass (nor by a later session in the process) while the
file is unchanged; anything that is not exactly what was verified (a bad checksum, non-zero padding, a write
since) is still verified, and refused, on read."""

from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from epctx.epcontext import ContextBinary, ContextBinaryWriter, checksums
from epctx.epcontext.shared_hash import sha256_verifying
from epctx.errors import InvalidGraph
from epctx.trust.digests import file_sha256

BIG = (
    (256 << 10) + 100
)  # not a multiple of the alignment (padding follows); above checksums.SHARED_MIN: the shared table applies
SMALL = 1000


@pytest.fixture(autouse=True)
def _fresh_table() -> None:
    checksums._VERIFIED.clear()


def _binary(path: Path, checksum: str = "xxh3_64") -> Path:
    rng = np.random.default_rng(0)
    w = ContextBinaryWriter(ep_name="ExampleEP", alignment=4096, checksum=checksum)
    w.add("graph", b"g" * SMALL)
    w.add("big", rng.integers(0, 255, BIG, dtype=np.uint8).tobytes(), kind="weight")
    w.add("big_copy", rng.integers(0, 255, BIG, dtype=np.uint8).tobytes(), kind="weight")
    w.write(path)
    return path


def _hash(path: Path) -> str:
    """What the trust check does for a binary: ``file_sha256`` with the loader's hasher."""
    return file_sha256(path, sha256_verifying)


@pytest.fixture
def verified_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the entries the container hashes on read."""
    seen: list[str] = []
    real = ContextBinary._verify

    def spy(self: ContextBinary, info, view):  # type: ignore[no-untyped-def]
        seen.append(info.name)
        return real(self, info, view)

    monkeypatch.setattr(ContextBinary, "_verify", spy)
    return seen


@pytest.mark.parametrize("checksum", ["xxh3_64", "crc32"])
def test_the_trust_hash_verifies_the_entries_once(
    tmp_path: Path, verified_reads: list[str], checksum: str
) -> None:
    path = _binary(tmp_path / "b.bin", checksum)
    assert _hash(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    with ContextBinary.open(path) as binary:
        for name in binary.names():
            binary.read(name)
    assert verified_reads == ["graph"]  # the large payloads were verified by the trust check's pass
    with ContextBinary.open(path) as binary:  # another session in the process
        binary.verify()
    assert verified_reads == ["graph", "graph"]


def test_the_container_pass_is_shared_between_sessions(tmp_path: Path, verified_reads: list[str]) -> None:
    """No policy: the first session's reads verify; a later session's reads of the unchanged file do not."""
    path = _binary(tmp_path / "b.bin")
    with ContextBinary.open(path) as binary:
        binary.verify()
    assert sorted(verified_reads) == ["big", "big_copy", "graph"]
    with ContextBinary.open(path) as binary:
        binary.verify()
    assert sorted(verified_reads) == ["big", "big_copy", "graph", "graph"]


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 1]))


def test_a_bad_payload_is_not_remembered(tmp_path: Path) -> None:
    """A payload whose checksum is wrong in the file (signed that way, say) is hashed for the signature all the
    same, and refused by the container on read."""
    path = _binary(tmp_path / "b.bin")
    with ContextBinary.open(path) as binary:
        offset = binary.entry("big").offset
    _flip(path, offset + 10)
    assert _hash(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    with ContextBinary.open(path) as binary, pytest.raises(InvalidGraph, match="'big': checksum mismatch"):
        binary.read("big")


def test_non_zero_padding_is_not_remembered(tmp_path: Path) -> None:
    path = _binary(tmp_path / "b.bin")
    with ContextBinary.open(path) as binary:
        offset = binary.entry("big_copy").offset
    _flip(path, offset - 1)  # the padding before the payload (alignment 4096)
    _hash(path)
    with (
        ContextBinary.open(path) as binary,
        pytest.raises(InvalidGraph, match="padding bytes .* are not zero"),
    ):
        binary.read("big_copy")


def test_a_write_after_the_pass_is_verified_again(tmp_path: Path, verified_reads: list[str]) -> None:
    path = _binary(tmp_path / "b.bin")
    _hash(path)
    with ContextBinary.open(path) as binary:
        offset = binary.entry("big").offset
        _flip(path, offset + 10)  # written in place after this binary was mapped: its version is stale now
        with pytest.raises(InvalidGraph, match="'big': checksum mismatch"):
            binary.read("big")
    assert verified_reads == ["big"]
    _flip(path, offset + 10)  # the same bytes again, a new version: verified on read
    with ContextBinary.open(path) as binary:
        binary.read("big")
    assert verified_reads == ["big", "big"]


def test_a_file_that_is_no_context_binary_is_hashed_plainly(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(os.urandom(BIG))
    assert _hash(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        st = os.fstat(fh.fileno())
        version = (st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns)
        assert sha256_verifying(mapped, fh.fileno(), version, str(path)) is None
    assert checksums._VERIFIED == {}
