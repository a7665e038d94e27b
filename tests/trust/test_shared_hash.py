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
from epctx.epcontext.load import _SharedPass
from epctx.epcontext.shared_hash import sha256_verifying
from epctx.errors import InvalidGraph
from epctx.trust import digests
from epctx.trust.digests import file_sha256

BIG = (
    (256 << 10) + 100
)  # not a multiple of the alignment (padding follows); above checksums.SHARED_MIN: the shared table applies
SMALL = 1000


def _new_process() -> None:
    """What a fresh process knows: nothing hashed, nothing verified."""
    checksums._VERIFIED.clear()
    digests._HASHED.clear()
    digests._NOTES.clear()


@pytest.fixture(autouse=True)
def _fresh_table() -> None:
    _new_process()


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
    return file_sha256(path, _SharedPass())


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


def _big_context_model(folder: Path) -> Path:
    """An Example-EP context model whose weight (256 x 256 float32, 256 KiB) is a payload of its binary."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import epctx

    folder.mkdir()
    weight = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 256])],
        [numpy_helper.from_array(weight, "W")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "model.onnx")
    so = epctx.SessionOptions()
    so.add_provider("ExampleExecutionProvider", {})
    epctx.ModelCompiler(so, str(folder / "model.onnx")).compile_to_file(str(folder / "model_ctx.onnx"))
    return folder / "model_ctx.onnx"


def test_sessions_under_a_policy_hash_each_payload_once(
    tmp_path: Path, verified_reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session under ``require``: the trust check's pass verifies the binary's payloads, its reads do not hash
    them again. A warm session of a new process: the verification record says what the pass found, for a file
    unchanged since: nothing is hashed at all. A write to the binary: all is hashed again."""
    import epctx
    from epctx.cli import main as cli_main
    from epctx.epcontext import shared_hash
    from tests.trust.test_signing import write_key

    passes: list[str] = []  # files the shared pass read
    real = shared_hash.sha256_verifying
    monkeypatch.setattr(
        shared_hash,
        "sha256_verifying",
        lambda m, fd, v, path: passes.append(Path(path).name) or real(m, fd, v, path),
    )

    ctx = _big_context_model(tmp_path / "m")
    private, public = write_key(tmp_path, "release")
    assert cli_main(["sign", str(ctx), "--key", str(private)]) == 0
    with ContextBinary.open(ctx.parent / "model_ExampleExecutionProvider.bin") as binary:
        big = [n for n in binary.names() if binary.entry(n).size >= checksums.SHARED_MIN]
    assert big, "the test needs a payload the shared table applies to"
    so = epctx.SessionOptions()
    so.add_session_config_entry("epctx.trust.policy", "require")
    so.add_session_config_entry("epctx.trust.keys", str(public))
    x = {"x": np.ones((2, 256), np.float32)}
    expected = epctx.InferenceSession(str(ctx), providers=["ExampleExecutionProvider"]).run(None, x)[0]
    _new_process()
    verified_reads.clear()
    got = epctx.InferenceSession(str(ctx), so, providers=["ExampleExecutionProvider"]).run(None, x)[0]
    np.testing.assert_array_equal(got, expected)
    assert not set(big) & set(verified_reads)  # the check's pass verified them
    assert passes == ["model_ExampleExecutionProvider.bin", "model_ctx.onnx"]
    passes.clear()
    _new_process()
    verified_reads.clear()
    epctx.InferenceSession(str(ctx), so, providers=["ExampleExecutionProvider"]).run(None, x)
    assert not set(big) & set(verified_reads)  # the record's notes: nothing hashed at all
    assert passes == []
    binary = ctx.parent / "model_ExampleExecutionProvider.bin"
    binary.write_bytes(binary.read_bytes())  # the same bytes written: a new version, verified again
    _new_process()
    verified_reads.clear()
    epctx.InferenceSession(str(ctx), so, providers=["ExampleExecutionProvider"]).run(None, x)
    assert not set(big) & set(verified_reads)  # hashed again by the check's pass (SHA-256 and entries)
    assert passes == ["model_ExampleExecutionProvider.bin"]  # only the file written
    _new_process()
    verified_reads.clear()
    epctx.InferenceSession(str(ctx), providers=["ExampleExecutionProvider"]).run(None, x)
    assert set(big) <= set(verified_reads)  # no policy: the container verifies on read, as always
