"""Signing model packages (the packages issue's folders) in OpenSSF model signing's format, both ways, and the
trust policy when a session opens a package: the package's signature, at its root, is checked before any
variant's binary is read; a tampered variant is refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

import epctx
from epctx.cli import main as cli_main
from epctx.errors import InvalidGraph, Untrusted
from epctx.testing.conformance import models
from tests.trust.test_signing import write_key

model_signing = pytest.importorskip("model_signing")

EXAMPLE = "ExampleExecutionProvider"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A package of one component (chain) with an Example variant and a CPU (plain model) one."""
    folder = tmp_path_factory.mktemp("spec")
    onnx.save(models.chain(), folder / "chain.onnx")
    spec = folder / "spec.toml"
    spec.write_text(
        '[package]\nname = "demo"\n\n[components.chain]\nmodel = "chain.onnx"\n\n'
        '[[targets]]\nname = "example"\nep = "ExampleExecutionProvider"\n\n'
        '[[targets]]\nname = "cpu"\nep = "CPUExecutionProvider"\n'
    )
    assert cli_main(["package", "build", str(spec), "-o", str(folder / "pkg"), "--workers", "1"]) == 0
    return folder / "pkg"


@pytest.fixture
def pkg(built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EPCTX_TRUST_RECORDS", str(tmp_path / "records"))
    return Path(shutil.copytree(built, tmp_path / "pkg"))


def _session(pkg: Path, policy: str, *keys: Path) -> epctx.InferenceSession:
    so = epctx.SessionOptions()
    so.add_session_config_entry("epctx.trust.policy", policy)
    so.add_session_config_entry("epctx.trust.keys", ":".join(map(str, keys)))
    return epctx.InferenceSession(str(pkg), so, providers=[EXAMPLE])


def _expected() -> np.ndarray:
    sess = epctx.InferenceSession(models.chain().SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, models.feeds())[0]


def _variant_binary(pkg: Path) -> Path:
    found = sorted(pkg.rglob(f"*_{EXAMPLE}.bin"))
    assert len(found) == 1, found
    return found[0]


@pytest.mark.slow  # a package build and model_signing's import: seconds
def test_epctx_signs_a_package_and_model_signing_verifies_it(
    pkg: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    private, public = write_key(tmp_path, "release")
    assert cli_main(["sign", str(pkg), "--key", str(private)]) == 0
    assert (pkg / "model.sig").is_file()
    verifier = model_signing.verifying.Config().use_elliptic_key_verifier(public_key=public)
    verifier.verify(pkg, pkg / "model.sig")
    assert cli_main(["verify", str(pkg), "--key", str(public)]) == 0
    out = capsys.readouterr().out
    assert "manifest.json" in out and f"_{EXAMPLE}.bin" in out
    assert cli_main(["package", "validate", str(pkg)]) == 0  # model.sig at the root is no stray file
    binary = _variant_binary(pkg)
    data = bytearray(binary.read_bytes())
    data[-1] ^= 1
    binary.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="Signature mismatch"):
        verifier.verify(pkg, pkg / "model.sig")
    assert cli_main(["verify", str(pkg), "--key", str(public)]) == 1


@pytest.mark.slow
def test_model_signing_signs_a_package_and_a_session_opens_it_under_require(
    pkg: Path, tmp_path: Path
) -> None:
    private, public = write_key(tmp_path, "release")
    hashing = model_signing.hashing.Config().set_ignored_paths(paths=["model.sig"])
    model_signing.signing.Config().use_elliptic_key_signer(private_key=private).set_hashing_config(
        hashing
    ).sign(pkg, pkg / "model.sig")
    assert cli_main(["verify", str(pkg), "--key", str(public)]) == 0
    for _ in range(2):  # the second time from the verification record
        got = _session(pkg, "require", public).run(None, models.feeds())[0]
        np.testing.assert_allclose(got, _expected(), rtol=1e-5, atol=1e-5)
    ctx = epctx.ModelPackageContext(pkg).select_component("chain")
    so = epctx.SessionOptions()
    so.add_session_config_entry("epctx.trust.policy", "require")
    so.add_session_config_entry("epctx.trust.keys", str(public))
    assert ctx.create_session(so, providers=[EXAMPLE]).run(None, models.feeds())[0].shape == got.shape


@pytest.mark.slow
def test_a_tampered_variant_is_refused_before_its_binary_is_read(
    pkg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    private, public = write_key(tmp_path, "release")
    _, stranger = write_key(tmp_path, "stranger")
    with pytest.raises(Untrusted, match=r"pkg/model.sig' does not exist"):  # unsigned: refused at the open
        _session(pkg, "require", public)
    assert cli_main(["sign", str(pkg), "--key", str(private)]) == 0
    with pytest.raises(Untrusted, match="not among the trusted keys"):  # signed by a key not trusted
        _session(pkg, "require", stranger)
    binary = _variant_binary(pkg)
    data = bytearray(binary.read_bytes())
    data[-1] ^= 1
    binary.write_bytes(bytes(data))
    opened: list[str] = []
    from epctx.epcontext import container

    real = container.ContextBinary.open

    def spy(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(container.ContextBinary, "open", staticmethod(spy))
    with pytest.raises(Untrusted, match=rf"require: '.*{binary.name}' \(carries native code|{binary.name}"):
        _session(pkg, "require", public)
    assert opened == []  # refused before the binary was opened
    with pytest.raises(
        InvalidGraph, match="checksum mismatch"
    ):  # warn: logged, and epctx's checksums catch it
        _session(pkg, "warn", public)
    assert opened  # this time the binary was read


@pytest.mark.slow
def test_a_package_may_not_set_the_trust_policy(pkg: Path) -> None:
    import json

    manifest = pkg / "manifest.json"
    doc = json.loads(manifest.read_text())
    text = json.dumps(doc)
    assert '"ort"' in text
    for variant in _variants(doc):
        variant.setdefault("executor_info", {}).setdefault("ort", {}).setdefault("session_options", {})[
            "epctx.trust.policy"
        ] = "off"
    manifest.write_text(json.dumps(doc))
    with pytest.raises(InvalidGraph, match="trust policy's; a package may not set it"):
        epctx.InferenceSession(str(pkg), providers=[EXAMPLE])


def _variants(doc: object) -> list[dict]:  # type: ignore[type-arg]
    found = []
    if isinstance(doc, dict):
        if "executor_info" in doc:
            found.append(doc)
        for value in doc.values():
            found += _variants(value)
    elif isinstance(doc, list):
        for value in doc:
            found += _variants(value)
    return found


@pytest.mark.slow
def test_an_encrypted_variant_is_read_through_the_read_callback(pkg: Path, tmp_path: Path) -> None:
    """A package whose variant binary the application keeps encrypted (moved out of the package): a session on
    the package gets it through the EPContext data read callback, under the name the variant's model records."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from tests.trust.test_hooks import MAGIC, EncryptedStore

    binary = _variant_binary(pkg)
    (tmp_path / "store").mkdir()
    store = EncryptedStore(tmp_path / "store", AESGCM.generate_key(bit_length=256))
    store.write(binary.name, binary.read_bytes())
    binary.unlink()
    for path in pkg.rglob("*"):
        assert not path.is_file() or MAGIC not in path.read_bytes()
    so = epctx.SessionOptions()
    so.set_ep_context_data_read_func(store.read)
    got = epctx.InferenceSession(str(pkg), so, providers=[EXAMPLE]).run(None, models.feeds())[0]
    np.testing.assert_allclose(got, _expected(), rtol=1e-5, atol=1e-5)
    assert store.reads == [binary.name]
    ctx = epctx.ModelPackageContext(pkg).select_component("chain")
    assert ctx.create_session(so, providers=[EXAMPLE]).run(None, models.feeds())[0].shape == got.shape
    with pytest.raises(InvalidGraph, match="does not exist"):  # without the callback: no such file
        epctx.InferenceSession(str(pkg), providers=[EXAMPLE])


@pytest.mark.slow
def test_a_package_session_looks_up_its_record_once(
    pkg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The package's check hands what it verified to the session's loader: one record look-up per warm session,
    one signature verification per cold one; a binary written after that (same stamps for the manifest and the
    model, which the package's check sees unchanged) is still refused by the loader."""
    from epctx.trust import bundle, record

    private, public = write_key(tmp_path, "release")
    assert cli_main(["sign", str(pkg), "--key", str(private)]) == 0
    reads: list[str] = []
    verified: list[str] = []
    real_read, real_verify = record.Record.read, bundle.read_and_verify
    monkeypatch.setattr(record.Record, "read", lambda self: reads.append(self.path.name) or real_read(self))
    monkeypatch.setattr(bundle, "read_and_verify", lambda *a: verified.append("sig") or real_verify(*a))
    expected = _expected()
    for _ in range(3):  # cold (no record), then warm twice
        got = _session(pkg, "require", public).run(None, models.feeds())[0]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert len(reads) == 3 and len(set(reads)) == 1  # one look-up per session, all in the package's record
    assert verified == [
        "sig"
    ]  # the cold session verified the signature once, for the manifest and the binary
    binary = _variant_binary(pkg)
    data = bytearray(binary.read_bytes())
    data[-1] ^= 1
    binary.write_bytes(bytes(data))
    with pytest.raises(Untrusted, match=rf"{binary.name}' \(data only\).*SHA-256 differs"):
        _session(pkg, "require", public)
    binary.write_bytes(bytes(data[:-1] + bytes([data[-1] ^ 1])))  # back to the signed bytes: loads again
    _session(pkg, "require", public).run(None, models.feeds())
