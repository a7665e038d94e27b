"""A model_signing signature, read and verified without model_signing (its import costs ~245 ms).

The format (model_signing 1.x, "traditional" key and certificate modes): a sigstore bundle
``application/vnd.dev.sigstore.bundle.v0.3+json`` whose ``dsseEnvelope`` holds an in-toto statement
(``https://model_signing/signature/v1.0``): one subject (the model's name, and a SHA-256 over the resource
digests in order), the serialization used (``files``: one SHA-256 per file, posix paths relative to the model
folder) and the resources. The envelope's signature is ECDSA over DSSE's pre-authentication encoding, with the
hash the curve calls for; ``verificationMaterial`` names the key (``publicKey.hint``: SHA-256 of its PEM) or
carries the certificate chain (``x509CertificateChain``)."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epctx.errors import Untrusted

if TYPE_CHECKING:
    from epctx.trust.keyless import Expected

__all__ = ["SignedManifest", "TrustedKey", "load_trusted_keys", "read_and_verify"]

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
_CURVES = {"secp256r1": "SHA256", "secp384r1": "SHA384", "secp521r1": "SHA512"}


@dataclasses.dataclass(frozen=True)
class TrustedKey:
    """A trusted EC public key (``certificate`` None) or a trusted certificate (a root or the signer's own)."""

    path: Path
    public_key: Any  # cryptography's EllipticCurvePublicKey
    hint: str  # SHA-256 of the key's SubjectPublicKeyInfo PEM, as model_signing records it
    certificate: Any = None  # cryptography's x509.Certificate

    @property
    def who(self) -> str:
        if self.certificate is not None:
            return f"certificate {self.certificate.subject.rfc4514_string()} ({self.path})"
        return f"key {self.hint[:16]} ({self.path})"


@dataclasses.dataclass(frozen=True)
class SignedManifest:
    """What a verified signature says: the model's name, each file's SHA-256, the files model_signing ignored,
    and who signed (the trusted key or the certificate that verified it)."""

    model_name: str
    digests: Mapping[str, str]  # posix path relative to the model folder -> sha256 hex
    ignore_paths: tuple[str, ...]
    signer: str
    valid_until: float | None = None  # POSIX time the signing certificate's chain stops being valid


def load_trusted_keys(paths: Sequence[Path]) -> list[TrustedKey]:
    """PEM public keys and certificates (a file may hold several certificates)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    keys: list[TrustedKey] = []
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise Untrusted(f"cannot read the trusted key {str(path)!r}: {exc.strerror or exc}") from exc
        if b"-----BEGIN CERTIFICATE-----" in data:
            for cert in x509.load_pem_x509_certificates(data):
                cert_key = cert.public_key()
                if isinstance(cert_key, ec.EllipticCurvePublicKey):
                    keys.append(TrustedKey(path, cert_key, _hint(cert_key), cert))
            continue
        try:
            key = serialization.load_pem_public_key(data)
        except ValueError as exc:
            raise Untrusted(f"{str(path)!r} is not a PEM public key or certificate: {exc}") from exc
        if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in _CURVES:
            raise Untrusted(f"{str(path)!r}: only EC keys on P-256, P-384 or P-521 are supported")
        keys.append(TrustedKey(path, key, _hint(key)))
    return keys


def _hint(key: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def pae(payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding."""
    kind = PAYLOAD_TYPE.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def read_and_verify(
    signature: Path, keys: Sequence[TrustedKey], keyless: Expected | None = None
) -> SignedManifest:
    """The manifest of ``signature`` once its envelope verifies with one of ``keys`` (or, for a sigstore keyless
    bundle, against ``keyless``: ``keyless.py``); Untrusted otherwise."""
    where = f"signature {str(signature)!r}"
    try:
        raw = signature.read_bytes()
        bundle = json.loads(raw)
        envelope = bundle["dsseEnvelope"]
        payload = base64.b64decode(envelope["payload"], validate=True)
        sig = base64.b64decode(envelope["signatures"][0]["sig"], validate=True)
        material = bundle.get("verificationMaterial") or {}
    except FileNotFoundError:
        raise Untrusted(f"{where} does not exist") from None
    except OSError as exc:
        raise Untrusted(f"cannot read {where}: {exc.strerror or exc}") from exc
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise Untrusted(f"{where} is not a model_signing signature (sigstore bundle): {exc!r}") from exc
    if bundle.get("mediaType") != BUNDLE_MEDIA_TYPE or envelope.get("payloadType") != PAYLOAD_TYPE:
        raise Untrusted(
            f"{where}: expected a {BUNDLE_MEDIA_TYPE} bundle over a {PAYLOAD_TYPE} payload, found "
            f"{bundle.get('mediaType')!r} over {envelope.get('payloadType')!r}"
        )
    from epctx.trust.keyless import is_keyless, verify_keyless

    if is_keyless(material):
        payload, signer = verify_keyless(raw, material, keyless, where)
        return _manifest(payload, signer, where)
    signer, valid_until = _verify_envelope(payload, sig, material, keys, where)
    return dataclasses.replace(_manifest(payload, signer, where), valid_until=valid_until)


def _verify_envelope(
    payload: bytes, sig: bytes, material: Mapping[str, Any], keys: Sequence[TrustedKey], where: str
) -> tuple[str, float | None]:
    """Who signed, and until when (POSIX time; None: no end) that verdict holds (a certificate's validity)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    chain = (material.get("x509CertificateChain") or {}).get("certificates") or []
    valid_until = None
    if chain:
        from epctx.trust.certificates import chain_signer

        trusted = [k.certificate for k in keys if k.certificate is not None]
        public_key, who, valid_until = chain_signer(chain, trusted, where)
        candidates = [(public_key, who)]
    else:
        hint = (material.get("publicKey") or {}).get("hint")
        candidates = [
            (k.public_key, k.who) for k in keys if k.certificate is None and (not hint or k.hint == hint)
        ]
        if not candidates:
            known = ", ".join(k.hint[:16] for k in keys if k.certificate is None) or "none"
            raise Untrusted(
                f"{where} was made with the key {str(hint)[:16]}..., which is not among the trusted keys "
                f"(epctx.trust.keys: {known})"
            )
    for public_key, who in candidates:
        if not isinstance(public_key, ec.EllipticCurvePublicKey):
            raise Untrusted(f"{where}: {who} holds a {type(public_key).__name__}; only EC keys are supported")
        algorithm = getattr(hashes, _CURVES.get(public_key.curve.name, "SHA256"))()
        try:
            public_key.verify(sig, pae(payload), ec.ECDSA(algorithm))
        except InvalidSignature:
            continue
        return who, valid_until
    raise Untrusted(f"{where}: the envelope's signature does not verify with the trusted key (tampered?)")


def _manifest(payload: bytes, signer: str, where: str) -> SignedManifest:
    try:
        statement = json.loads(payload)
        if statement.get("_type") != STATEMENT_TYPE or statement.get("predicateType") != PREDICATE_TYPE:
            raise ValueError(f"statement {statement.get('_type')!r} / {statement.get('predicateType')!r}")
        (subject,) = statement["subject"]
        predicate = statement["predicate"]
        serialization = predicate["serialization"]
        resources = predicate["resources"]
    except (ValueError, KeyError, TypeError) as exc:
        raise Untrusted(f"{where}: the signed statement is not model_signing's v1.0: {exc}") from exc
    if serialization.get("method") != "files" or serialization.get("hash_type") != "sha256":
        raise Untrusted(
            f"{where}: serialization {serialization.get('method')!r} / {serialization.get('hash_type')!r}; "
            "epctx verifies model_signing's 'files' serialization with sha256"
        )
    root = hashlib.sha256()
    digests: dict[str, str] = {}
    for resource in resources:
        digest = bytes.fromhex(resource["digest"])
        root.update(digest)
        digests[resource["name"]] = resource["digest"]
    if root.hexdigest() != subject["digest"]["sha256"]:
        raise Untrusted(f"{where}: the statement is inconsistent (its root digest does not match its files)")
    ignored = tuple(str(p) for p in serialization.get("ignore_paths") or ())
    return SignedManifest(str(subject.get("name", "")), digests, ignored, signer)
