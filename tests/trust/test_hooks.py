"""EPContext data write / read callbacks (onnxruntime's named-buffer hooks) with AES-GCM from ``cryptography``:
the binaries are stored encrypted by the application, no plaintext binary touches the disk, and a session gets
them back through the read callback, on both load paths and from model bytes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

import epctx
from epctx.errors import Untrusted
from tests.epcontext.models import EXAMPLE, feed, two_partition_model, whole_model
from tests.trust.test_signing import write_key

MAGIC = b"EPCTXBIN"


class EncryptedStore:
    """The application's side: each binary AES-GCM encrypted into ``<folder>/<name>.enc`` (nonce + ciphertext),
    its name bound as associated data (a file renamed to another binary's name does not decrypt)."""

    def __init__(self, folder: Path, key: bytes) -> None:
        self.folder, self.aead = folder, AESGCM(key)
        self.reads: list[str] = []

    def write(self, name: str, data: bytes) -> None:
        nonce = os.urandom(12)
        (self.folder / f"{name}.enc").write_bytes(nonce + self.aead.encrypt(nonce, data, name.encode()))

    def read(self, name: str) -> bytes:
        self.reads.append(name)
        blob = (self.folder / f"{name}.enc").read_bytes()
        return self.aead.decrypt(blob[:12], blob[12:], name.encode())


def _compiler(source: Path, store: EncryptedStore, **config: str) -> epctx.ModelCompiler:
    so = epctx.SessionOptions()
    so.add_provider(EXAMPLE, {})
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    compiler = epctx.ModelCompiler(so, str(source))
    compiler.set_ep_context_data_write_func(store.write)
    return compiler


def _session(model: Path | bytes, store: EncryptedStore, **config: str) -> epctx.InferenceSession:
    so = epctx.SessionOptions()
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    so.set_ep_context_data_read_func(store.read)
    return epctx.InferenceSession(model if isinstance(model, bytes) else str(model), so, providers=[EXAMPLE])


def _no_plaintext_binary(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            assert MAGIC not in path.read_bytes(), f"{path} holds a plaintext context binary"


@pytest.mark.parametrize("make", [whole_model, two_partition_model], ids=["lean", "full"])
def test_encrypted_binaries_round_trip(tmp_path: Path, make) -> None:  # type: ignore[no-untyped-def]
    onnx.save(make(), tmp_path / "model.onnx")
    expected = epctx.InferenceSession(str(tmp_path / "model.onnx"), providers=[EXAMPLE]).run(None, feed())[0]
    out = tmp_path / "out"
    out.mkdir()
    store = EncryptedStore(out, AESGCM.generate_key(bit_length=256))
    _compiler(tmp_path / "model.onnx", store).compile_to_file(str(out / "model_ctx.onnx"))
    assert {p.name for p in out.iterdir()} == {"model_ctx.onnx", f"model_{EXAMPLE}.bin.enc"}
    _no_plaintext_binary(out)
    got = _session(out / "model_ctx.onnx", store).run(None, feed())[0]
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert store.reads == [f"model_{EXAMPLE}.bin"]
    with pytest.raises(epctx.InvalidGraph, match="does not exist"):  # without the callback: no such file
        epctx.InferenceSession(str(out / "model_ctx.onnx"), providers=[EXAMPLE])


def test_bytes_in_bytes_out_nothing_on_disk_in_plaintext(tmp_path: Path) -> None:
    onnx.save(whole_model(), tmp_path / "model.onnx")
    expected = epctx.InferenceSession(str(tmp_path / "model.onnx"), providers=[EXAMPLE]).run(None, feed())[0]
    (tmp_path / "store").mkdir()
    store = EncryptedStore(tmp_path / "store", AESGCM.generate_key(bit_length=128))
    model = _compiler(tmp_path / "model.onnx", store).compile_to_bytes()
    _no_plaintext_binary(tmp_path / "store")
    assert MAGIC not in model  # the binary is not embedded either
    np.testing.assert_allclose(_session(model, store).run(None, feed())[0], expected, atol=1e-5)


def test_wrong_key_and_altered_ciphertext_are_fail(tmp_path: Path) -> None:
    onnx.save(whole_model(), tmp_path / "model.onnx")
    store = EncryptedStore(tmp_path, AESGCM.generate_key(bit_length=256))
    _compiler(tmp_path / "model.onnx", store).compile_to_file(str(tmp_path / "model_ctx.onnx"))
    wrong = EncryptedStore(tmp_path, AESGCM.generate_key(bit_length=256))
    with pytest.raises(
        epctx.Fail, match=f"read callback failed for the context binary 'model_{EXAMPLE}.bin'"
    ) as info:
        _session(tmp_path / "model_ctx.onnx", wrong)
    assert isinstance(info.value.__cause__, InvalidTag)
    enc = tmp_path / f"model_{EXAMPLE}.bin.enc"
    data = bytearray(enc.read_bytes())
    data[40] ^= 1
    enc.write_bytes(bytes(data))
    with pytest.raises(epctx.Fail, match="read callback failed"):
        _session(tmp_path / "model_ctx.onnx", store)


def test_a_callback_that_returns_garbage_is_invalid_graph(tmp_path: Path) -> None:
    onnx.save(whole_model(), tmp_path / "model.onnx")
    store = EncryptedStore(tmp_path, AESGCM.generate_key(bit_length=256))
    _compiler(tmp_path / "model.onnx", store).compile_to_file(str(tmp_path / "model_ctx.onnx"))
    store.read = lambda name: b"not a context binary at all, 32+ bytes long"  # type: ignore[method-assign]
    with pytest.raises(epctx.InvalidGraph, match="from the EPContext data read callback"):
        _session(tmp_path / "model_ctx.onnx", store)


def test_options_the_callback_cannot_serve(tmp_path: Path) -> None:
    onnx.save(whole_model(), tmp_path / "model.onnx")
    store = EncryptedStore(tmp_path, AESGCM.generate_key(bit_length=256))
    so = epctx.SessionOptions()
    so.add_provider(EXAMPLE, {})
    embedded = epctx.ModelCompiler(so, str(tmp_path / "model.onnx"), embed_compiled_data_into_model=True)
    embedded.set_ep_context_data_write_func(store.write)
    with pytest.raises(epctx.InvalidArgument, match="takes the binaries that are not embedded"):
        embedded.compile_to_file(str(tmp_path / "a_ctx.onnx"))
    with pytest.raises(epctx.InvalidArgument, match="must be callable"):
        epctx.SessionOptions().set_ep_context_data_read_func("decrypt")  # type: ignore[arg-type]


def test_trust_policy_cannot_cover_callback_binaries(tmp_path: Path) -> None:
    onnx.save(whole_model(), tmp_path / "model.onnx")
    store = EncryptedStore(tmp_path, AESGCM.generate_key(bit_length=256))
    _compiler(tmp_path / "model.onnx", store).compile_to_file(str(tmp_path / "model_ctx.onnx"))
    _, public = write_key(tmp_path, "release")
    config = {"epctx.trust.policy": "require", "epctx.trust.keys": str(public)}
    with pytest.raises(Untrusted, match="EPContext data read callback, which no folder signature covers"):
        _session(tmp_path / "model_ctx.onnx", store, **config)
    assert store.reads == []  # refused before the callback was asked


def _sharing_variant(seed: int) -> onnx.ModelProto:
    """Same W1 in every variant (weights the group stores once), the other weights differ."""
    model, base = two_partition_model(seed), two_partition_model(0)
    for init in model.graph.initializer:
        if init.name == "W1":
            init.CopyFrom(next(i for i in base.graph.initializer if i.name == "W1"))
    return model


def _compile_group(tmp_path: Path, store: EncryptedStore, count: int) -> list[Path]:
    sources = []
    for k in range(count):
        onnx.save(_sharing_variant(k), tmp_path / f"m{k}.onnx")
        sources.append(tmp_path / f"m{k}.onnx")
    out = tmp_path / "out"
    out.mkdir()
    for k, source in enumerate(sources):
        stop = {"ep.stop_share_ep_contexts": "1"} if k == count - 1 else {}
        compiler = _compiler(source, store, **{"ep.share_ep_contexts": "1"}, **stop)
        compiler.compile_to_file(str(out / f"m{k}_ctx.onnx"))
    return sources


def _recorded_names(model: Path) -> set[str]:
    found = set()
    for node in onnx.load(model, load_external_data=False).graph.node:
        if node.op_type == "EPContext":
            attrs = {a.name: a for a in node.attribute}
            if "ep_cache_context" in attrs:  # main_context=0 nodes name none
                found.add(attrs["ep_cache_context"].s.decode())
    return found


def test_weight_sharing_group_through_the_callbacks(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    store = EncryptedStore(tmp_path / "store", AESGCM.generate_key(bit_length=256))
    written: list[str] = []
    write = store.write
    store.write = lambda name, data: (written.append(name), write(name, data))  # type: ignore[method-assign]
    sources = _compile_group(tmp_path, store, 3)
    out = tmp_path / "out"
    shared = f"m0_{EXAMPLE}.bin"
    assert written == [shared]  # the group's one shared binary, through the callback once
    assert {p.name for p in out.iterdir()} == {"m0_ctx.onnx", "m1_ctx.onnx", "m2_ctx.onnx"}
    assert [p.name for p in (tmp_path / "store").iterdir()] == [f"{shared}.enc"]
    _no_plaintext_binary(out)
    _no_plaintext_binary(tmp_path / "store")
    for k in range(3):
        assert _recorded_names(out / f"m{k}_ctx.onnx") == {shared}
    share = {"ep.share_ep_contexts": "1"}
    for k, source in enumerate(sources):  # sessions of a sharing group: the callback asked once for all
        stop = {"ep.stop_share_ep_contexts": "1"} if k == 2 else {}
        got = _session(out / f"m{k}_ctx.onnx", store, **share, **stop).run(None, feed())[0]
        expected = epctx.InferenceSession(str(source), providers=[EXAMPLE]).run(None, feed())[0]
        np.testing.assert_allclose(got, expected, atol=1e-5)
    assert store.reads == [shared]
    _session(out / "m0_ctx.onnx", store, **share)  # the last session released the group: asked anew
    assert store.reads == [shared, shared]
    from epctx.epcontext.workspace import workspace

    workspace(EXAMPLE).release_loaded()


def test_a_sharing_group_uses_one_write_callback(tmp_path: Path) -> None:
    onnx.save(_sharing_variant(0), tmp_path / "m0.onnx")
    onnx.save(_sharing_variant(1), tmp_path / "m1.onnx")
    store = EncryptedStore(tmp_path, AESGCM.generate_key(bit_length=256))
    share = {"ep.share_ep_contexts": "1"}
    _compiler(tmp_path / "m0.onnx", store, **share).compile_to_file(str(tmp_path / "m0_ctx.onnx"))
    so = epctx.SessionOptions()
    so.add_provider(EXAMPLE, {})
    so.add_session_config_entry("ep.share_ep_contexts", "1")
    so.add_session_config_entry("ep.stop_share_ep_contexts", "1")
    with pytest.raises(epctx.InvalidArgument, match="same EPContext data write function"):
        epctx.ModelCompiler(so, str(tmp_path / "m1.onnx")).compile_to_file(str(tmp_path / "m1_ctx.onnx"))
    assert not list(tmp_path.glob("*.bin")) and not list(tmp_path.glob("*.enc"))  # the group rolled back
