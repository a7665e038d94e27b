"""A bundle's certificate chain, checked up to a trusted certificate (``epctx.trust.keys``).

What is checked, and when:
- **the chain**: each certificate is issued (name and signature) by the next one, ending at a trusted
  certificate; every issuer on the way is a CA (BasicConstraints ``ca=True``; ``keyCertSign`` when it has a
  key usage), so a trusted signing certificate cannot issue others;
- **validity dates**, of every certificate on the path, the trusted one included, **now**: a model_signing
  certificate bundle carries no signing time (no RFC 3161 timestamp, no transparency-log entry), and a time
  the signer wrote into the signed statement would be the signer's own word. So a signature made with a
  certificate that has since expired is refused (re-sign with a current one); model_signing's own verifier
  checks the chain at the signing certificate's not-before time instead, and accepts it. A verification record
  lasts no longer than the earliest not-after on the path (``valid_until``);
- **key usage** of the signing certificate: its KeyUsage, when present, must allow ``digitalSignature``; its
  ExtendedKeyUsage, when present, must include ``codeSigning`` (or ``anyExtendedKeyUsage``); a certificate
  with neither is refused, as model_signing refuses it.

Revocation (CRL / OCSP) is not checked: it needs the network, and a signature's CA may not publish any.
Every refusal is ``Untrusted`` naming the certificate and the reason."""

from __future__ import annotations

import base64
import datetime
from collections.abc import Sequence
from typing import Any

from epctx.errors import Untrusted

__all__ = ["chain_signer"]


def chain_signer(chain: Sequence[Any], trusted: Sequence[Any], where: str) -> tuple[Any, str, float]:
    """The signing certificate's public key, who it is, and until when (POSIX time) the verdict holds, once
    the bundle's ``chain`` (``x509CertificateChain.certificates``: the signing certificate first) leads to a
    ``trusted`` certificate and passes the checks above."""
    from cryptography import x509

    try:
        certs = [x509.load_der_x509_certificate(base64.b64decode(c["rawBytes"])) for c in chain]
    except (ValueError, KeyError, TypeError) as exc:
        raise Untrusted(f"{where}: its certificate chain cannot be read: {exc!r}") from exc
    leaf = certs[0]
    path = _path(leaf, certs[1:], trusted)
    if path is None:
        raise Untrusted(
            f"{where}: its certificate {_name(leaf)} does not chain to a trusted certificate (epctx.trust.keys)"
        )
    now = datetime.datetime.now(datetime.timezone.utc)
    for cert in path:
        _check_dates(cert, now, where)
    for issuer in path[1:]:
        _check_issuer(issuer, where)
    _check_signing_usage(leaf, where)
    valid_until = min(cert.not_valid_after_utc for cert in path).timestamp()
    return leaf.public_key(), f"certificate {_name(leaf)}", valid_until


def _path(leaf: Any, given: Sequence[Any], trusted: Sequence[Any]) -> list[Any] | None:
    """The certificates from ``leaf`` to a trusted one (both included), or None."""
    path = [leaf]
    for _ in range(len(given) + 2):
        current = path[-1]
        if any(current == root for root in trusted):
            return path
        issuers = [c for c in (*trusted, *given) if c.subject == current.issuer and c not in path]
        issuer = next((c for c in issuers if _issued_by(current, c)), None)
        if issuer is None:
            return None
        path.append(issuer)
    return None


def _issued_by(cert: Any, issuer: Any) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
    except Exception:  # cryptography raises ValueError, TypeError or InvalidSignature
        return False
    return True


def _name(cert: Any) -> str:
    return str(cert.subject.rfc4514_string())


def _check_dates(cert: Any, now: datetime.datetime, where: str) -> None:
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now < start:
        raise Untrusted(
            f"{where}: certificate {_name(cert)} is not valid yet: not before {start.isoformat()} (now "
            f"{now.isoformat(timespec='seconds')})"
        )
    if now > end:
        raise Untrusted(
            f"{where}: certificate {_name(cert)} expired: not after {end.isoformat()} (now "
            f"{now.isoformat(timespec='seconds')}); epctx checks certificates at verification time (the bundle "
            "records no signing time): re-sign with a valid certificate"
        )


def _check_issuer(cert: Any, where: str) -> None:
    from cryptography import x509

    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    usage = _extension(cert, x509.KeyUsage)
    if not is_ca or (usage is not None and not usage.key_cert_sign):
        raise Untrusted(
            f"{where}: certificate {_name(cert)} issued another certificate of the chain but is not a CA "
            "(BasicConstraints ca=True and key usage keyCertSign expected)"
        )


def _check_signing_usage(cert: Any, where: str) -> None:
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    usage = _extension(cert, x509.KeyUsage)
    extended = _extension(cert, x509.ExtendedKeyUsage)
    if usage is None and extended is None:
        raise Untrusted(
            f"{where}: the signing certificate {_name(cert)} has neither a key usage nor an extended key usage "
            "allowing code signing (expected digitalSignature, and codeSigning where extended key usage is given)"
        )
    if usage is not None and not usage.digital_signature:
        raise Untrusted(
            f"{where}: the signing certificate {_name(cert)} has a key usage without digitalSignature: it may "
            "not sign"
        )
    allowed = {ExtendedKeyUsageOID.CODE_SIGNING, ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE}
    if extended is not None and not allowed.intersection(extended):
        names = ", ".join(oid._name for oid in extended) or "none"
        raise Untrusted(
            f"{where}: the signing certificate {_name(cert)} has an extended key usage without codeSigning "
            f"({names}): it may not sign code"
        )


def _extension(cert: Any, kind: Any) -> Any:
    from cryptography import x509

    try:
        return cert.extensions.get_extension_for_class(kind).value
    except x509.ExtensionNotFound:
        return None
