"""Signing in OpenSSF model signing's format, both ways: what ``epctx sign`` writes verifies with model_signing's
own verifier, and what model_signing writes verifies in epctx (``epctx verify`` and the load policy); EC keys
and certificates, offline."""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np
import onnx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import epctx
from epctx.cli import main as cli_main
from tests.epcontext.models import EXAMPLE, feed, whole_model

model_signing = pytest.importorskip("model_signing")


def write_key(folder: Path, name: str, curve: ec.EllipticCurve | None = None) -> tuple[Path, Path]:
    """An EC key pair as PEM files: (private, public)."""
    key = ec.generate_private_key(curve or ec.SECP256R1())
    private = folder / f"{name}.pem"
    public = folder / f"{name}.pub"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


def context_model(folder: Path, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(whole_model(seed), folder / "model.onnx")
    so = epctx.SessionOptions()
    so.add_provider(EXAMPLE, {})
    epctx.ModelCompiler(so, str(folder / "model.onnx")).compile_to_file(str(folder / "model_ctx.onnx"))
    return folder / "model_ctx.onnx"


def test_epctx_signature_verifies_with_model_signing(tmp_path: Path) -> None:
    private, public = write_key(tmp_path, "key")
    ctx = context_model(tmp_path / "m")
    assert cli_main(["sign", str(ctx), "--key", str(private)]) == 0
    assert (ctx.parent / "model.sig").is_file()
    model_signing.verifying.Config().use_elliptic_key_verifier(public_key=public).verify(
        ctx.parent, ctx.parent / "model.sig"
    )
    # and model_signing notices a changed file in what epctx signed
    (ctx.parent / f"model_{EXAMPLE}.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="Signature mismatch"):
        model_signing.verifying.Config().use_elliptic_key_verifier(public_key=public).verify(
            ctx.parent, ctx.parent / "model.sig"
        )


@pytest.mark.parametrize("curve", [ec.SECP256R1(), ec.SECP384R1()], ids=["p256", "p384"])
def test_model_signing_signature_verifies_in_epctx(
    tmp_path: Path, curve: ec.EllipticCurve, capsys: pytest.CaptureFixture[str]
) -> None:
    private, public = write_key(tmp_path, "key", curve)
    ctx = context_model(tmp_path / "m")
    hashing = model_signing.hashing.Config().set_ignored_paths(paths=["model.sig"])
    model_signing.signing.Config().use_elliptic_key_signer(private_key=private).set_hashing_config(
        hashing
    ).sign(ctx.parent, ctx.parent / "model.sig")
    assert cli_main(["verify", str(ctx), "--key", str(public)]) == 0
    out = capsys.readouterr().out
    assert "signed by key" in out and str(public) in out
    assert f"ok       model_{EXAMPLE}.bin" in out and "ok       model_ctx.onnx" in out

    so = epctx.SessionOptions()
    so.add_session_config_entry("epctx.trust.policy", "require")
    so.add_session_config_entry("epctx.trust.keys", str(public))
    got = epctx.InferenceSession(str(ctx), so, providers=[EXAMPLE]).run(None, feed())[0]
    want = epctx.InferenceSession(str(ctx), providers=[EXAMPLE]).run(None, feed())[0]
    np.testing.assert_array_equal(got, want)


def test_verify_fails_on_any_change(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    private, public = write_key(tmp_path, "key")
    _, other = write_key(tmp_path, "other")
    ctx = context_model(tmp_path / "m")
    assert cli_main(["sign", str(ctx.parent), "--key", str(private)]) == 0
    capsys.readouterr()
    assert cli_main(["verify", str(ctx), "--key", str(other)]) == 1
    assert "not among the trusted keys" in capsys.readouterr().err
    (ctx.parent / "notes.txt").write_text("added after signing")
    assert cli_main(["verify", str(ctx), "--key", str(public)]) == 1
    assert "unsigned notes.txt" in capsys.readouterr().out
    (ctx.parent / "notes.txt").unlink()
    binary = ctx.parent / f"model_{EXAMPLE}.bin"
    data = bytearray(binary.read_bytes())
    data[-1] ^= 1
    binary.write_bytes(bytes(data))
    assert cli_main(["verify", str(ctx), "--key", str(public), "--json"]) == 1
    assert '"status": "changed"' in capsys.readouterr().out
    binary.unlink()
    assert cli_main(["verify", str(ctx), "--key", str(public)]) == 1
    assert f"missing  model_{EXAMPLE}.bin" in capsys.readouterr().out


def _certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a code-signing leaf: (leaf private key, leaf certificate, CA certificate)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "epctx test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "epctx release signer")]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = (folder / "leaf.pem", folder / "leaf.crt", folder / "ca.crt")
    paths[0].write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return paths


def test_certificates_both_ways(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    leaf_key, leaf_cert, ca_cert = _certificates(tmp_path)
    ctx = context_model(tmp_path / "m")
    sign = [
        "sign",
        str(ctx),
        "--key",
        str(leaf_key),
        "--certificate",
        str(leaf_cert),
        "--chain",
        str(ca_cert),
    ]
    assert cli_main(sign) == 0
    model_signing.verifying.Config().use_certificate_verifier(certificate_chain=[ca_cert]).verify(
        ctx.parent, ctx.parent / "model.sig"
    )
    capsys.readouterr()
    assert cli_main(["verify", str(ctx), "--key", str(ca_cert)]) == 0
    assert "certificate CN=epctx release signer" in capsys.readouterr().out
    _, _, other_ca = _certificates(tmp_path / "x" if (tmp_path / "x").mkdir() is None else tmp_path)
    assert cli_main(["verify", str(ctx), "--key", str(other_ca)]) == 1
    assert "does not chain to a trusted certificate" in capsys.readouterr().err


def test_generation_signs_as_it_writes(tmp_path: Path) -> None:
    """epctx.trust.sign_key: the compile API, sessions with ep.context_enable=1 and `epctx compile --sign`."""
    from epctx.session.compile_guard import no_compile

    private, public = write_key(tmp_path, "key")
    verifier = model_signing.verifying.Config().use_elliptic_key_verifier(public_key=public)
    for way in ("api", "session", "cli"):
        folder = tmp_path / way
        folder.mkdir()
        onnx.save(whole_model(), folder / "model.onnx")
        so = epctx.SessionOptions()
        so.add_session_config_entry("epctx.trust.sign_key", str(private))
        if way == "api":
            so.add_provider(EXAMPLE, {})
            epctx.ModelCompiler(so, str(folder / "model.onnx")).compile_to_file(
                str(folder / "model_ctx.onnx")
            )
        elif way == "session":
            so.add_session_config_entry("ep.context_enable", "1")
            epctx.InferenceSession(str(folder / "model.onnx"), so, providers=[EXAMPLE])
        else:
            assert (
                cli_main(["compile", str(folder / "model.onnx"), "-p", EXAMPLE, "--sign", str(private), "-q"])
                == 0
            )
        verifier.verify(folder, folder / "model.sig")
        run = epctx.SessionOptions()
        run.add_session_config_entry("epctx.trust.policy", "require")
        run.add_session_config_entry("epctx.trust.keys", str(public))
        epctx.InferenceSession(str(folder / "model_ctx.onnx"), run, providers=[EXAMPLE]).run(None, feed())
    so = epctx.SessionOptions()
    so.add_provider(EXAMPLE, {})
    so.add_session_config_entry("epctx.trust.sign_key", str(tmp_path / "missing.pem"))
    with no_compile(), pytest.raises(epctx.NoSuchFile, match="missing.pem"):
        epctx.ModelCompiler(so, str(tmp_path / "api" / "model.onnx")).compile_to_file(
            str(tmp_path / "x_ctx.onnx")
        )
    with pytest.raises(epctx.InvalidArgument, match="must be one of off, warn, require, require-native"):
        epctx.SessionOptions().add_session_config_entry("epctx.trust.policy", "strict")
