"""Certificates in ``epctx.trust.keys``: the signing certificate's chain is checked for validity dates (now: the
bundle records no signing time), key usage (digitalSignature; codeSigning where extended key usage is given) and
CA issuers, each refusal ``Untrusted`` naming the reason; a verification record ends with the chain's validity.
Certificates are made here with ``cryptography``; bundles are signed by ``epctx sign`` (model_signing)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import epctx
from epctx.cli import main as cli_main
from epctx.errors import Untrusted
from tests.epcontext.models import EXAMPLE, feed
from tests.trust.test_signing import context_model

pytest.importorskip("model_signing")

DAY = datetime.timedelta(days=1)
SIGN_ONLY = x509.KeyUsage(True, False, False, False, False, False, False, False, False)
CA_USAGE = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
ENCIPHER_ONLY_USAGE = x509.KeyUsage(False, False, True, False, False, False, False, False, False)


@dataclasses.dataclass
class Leaf:
    """The signing certificate's settings (a good code-signing certificate by default)."""

    start: datetime.timedelta = -DAY  # not before, from now
    end: datetime.timedelta = 7 * DAY  # not after, from now
    usage: x509.KeyUsage | None = SIGN_ONLY
    extended: list[x509.ObjectIdentifier] | None = dataclasses.field(
        default_factory=lambda: [ExtendedKeyUsageOID.CODE_SIGNING]
    )
    ca_end: datetime.timedelta = 30 * DAY
    ca_is_ca: bool = True


def _cert(subject: str, issuer: str, key, signer, start, end, extensions):  # type: ignore[no-untyped-def]
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + start)
        .not_valid_after(now + end)
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(signer, hashes.SHA256())


def make_certificates(folder: Path, leaf: Leaf) -> tuple[Path, Path, Path]:
    """(leaf private key, leaf certificate, CA certificate) as PEM files in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_ext = [(x509.BasicConstraints(ca=leaf.ca_is_ca, path_length=None), True)]
    ca_ext += [(CA_USAGE if leaf.ca_is_ca else SIGN_ONLY, True)]
    ca = _cert("epctx test CA", "epctx test CA", ca_key, ca_key, -DAY, leaf.ca_end, ca_ext)
    ext: list[tuple[x509.ExtensionType, bool]] = [(x509.BasicConstraints(ca=False, path_length=None), True)]
    if leaf.usage is not None:
        ext.append((leaf.usage, True))
    if leaf.extended is not None:
        ext.append((x509.ExtendedKeyUsage(leaf.extended), False))
    cert = _cert("epctx release signer", "epctx test CA", leaf_key, ca_key, leaf.start, leaf.end, ext)
    paths = (folder / "leaf.pem", folder / "leaf.crt", folder / "ca.crt")
    paths[0].write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return paths


def _signed(tmp_path: Path, leaf: Leaf) -> tuple[Path, Path]:
    """A context model signed with a certificate made as ``leaf`` says: (context model, CA certificate)."""
    key, cert, ca = make_certificates(tmp_path / "pki", leaf)
    ctx = context_model(tmp_path / "m")
    sign = ["sign", str(ctx), "--key", str(key), "--certificate", str(cert), "--chain", str(ca)]
    assert cli_main(sign) == 0
    return ctx, ca


def _session(ctx: Path, trusted: Path) -> epctx.InferenceSession:
    so = epctx.SessionOptions()
    so.add_session_config_entry("epctx.trust.policy", "require")
    so.add_session_config_entry("epctx.trust.keys", str(trusted))
    return epctx.InferenceSession(str(ctx), so, providers=[EXAMPLE])


def test_a_valid_code_signing_certificate_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ctx, ca = _signed(tmp_path, Leaf())
    _session(ctx, ca).run(None, feed())
    assert cli_main(["verify", str(ctx), "--key", str(ca)]) == 0
    assert "certificate CN=epctx release signer" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("leaf", "reason"),
    [
        (Leaf(start=-10 * DAY, end=-DAY), r"certificate CN=epctx release signer expired: not after"),
        (Leaf(start=DAY, end=10 * DAY), r"certificate CN=epctx release signer is not valid yet: not before"),
        (Leaf(ca_end=-DAY / 2), r"certificate CN=epctx test CA expired"),
        (Leaf(usage=ENCIPHER_ONLY_USAGE), r"has a key usage without digitalSignature"),
        (
            Leaf(extended=[ExtendedKeyUsageOID.SERVER_AUTH]),
            r"extended key usage without codeSigning \(serverAuth\)",
        ),
        (Leaf(usage=None, extended=None), r"neither a key usage nor an extended key usage"),
        (Leaf(ca_is_ca=False), r"certificate CN=epctx test CA issued another certificate .* is not a CA"),
    ],
    ids=[
        "expired",
        "not-yet-valid",
        "expired-ca",
        "no-digital-signature",
        "server-auth-only",
        "no-usage",
        "non-ca",
    ],
)
def test_a_bad_certificate_is_refused_naming_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], leaf: Leaf, reason: str
) -> None:
    ctx, ca = _signed(tmp_path, leaf)
    with pytest.raises(Untrusted, match=reason):
        _session(ctx, ca)
    capsys.readouterr()
    assert cli_main(["verify", str(ctx), "--key", str(ca)]) == 1
    assert re.search(reason, capsys.readouterr().err)


def test_the_code_signing_usage_alone_or_digital_signature_alone_is_enough(tmp_path: Path) -> None:
    ctx, ca = _signed(tmp_path / "eku", Leaf(usage=None))
    _session(ctx, ca).run(None, feed())
    ctx, ca = _signed(tmp_path / "ku", Leaf(extended=None))
    _session(ctx, ca).run(None, feed())


def test_the_record_ends_with_the_certificate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record made under a certificate lasts until the chain's earliest not-after; after it, the next session
    verifies again (and so would refuse an expired certificate) instead of trusting the record."""
    import epctx.trust.record as record

    ctx, ca = _signed(tmp_path, Leaf(end=2 * DAY))
    _session(ctx, ca)
    (saved,) = list((tmp_path / "records").glob("*.json"))  # conftest: records in the test's folder
    until = json.loads(saved.read_text())["valid_until"]
    leaf = x509.load_pem_x509_certificate((tmp_path / "pki" / "leaf.crt").read_bytes())
    assert until == leaf.not_valid_after_utc.timestamp()
    reads: list[bool] = []
    real = record.Record.read

    def spy(self: record.Record) -> dict[str, list[int] | None]:
        found = real(self)
        reads.append(bool(found))
        return found

    monkeypatch.setattr(record.Record, "read", spy)
    _session(ctx, ca)
    assert reads == [True]  # within validity: the record stands
    monkeypatch.setattr(record.time, "time", lambda: until + 1)
    _session(ctx, ca)  # the certificate is still valid by the real clock: verified again, and loads
    assert reads == [True, False]
