"""sigstore keyless signatures (a Fulcio certificate for an OpenID Connect identity, a transparency-log entry),
verified offline with a trusted root the user supplies.

A keyless bundle proves who signed and when without a network: the signing certificate chains to the Fulcio CA
of the trusted root, carries a signed certificate timestamp from one of its CT logs, and the bundle holds the
Rekor entry (inclusion proof, signed checkpoint or promise) and optionally RFC 3161 timestamps, all checked
against the keys of the trusted root; the certificate is checked at the time the log (or the timestamp
authority) attests, not now (it is valid for minutes). What the network would add is only fetching a fresh
trusted root (sigstore's TUF repository): here the user gives one (``epctx.trust.sigstore_root``: sigstore's
``trusted_root.json``, or a client trust config holding one), with the identity and the issuer to expect
(``epctx.trust.sigstore_identity``, ``epctx.trust.sigstore_issuer``). The verification is sigstore-python's
(``sigstore.verify.Verifier.verify_dsse``; ~0.5 s of imports, paid only when a keyless bundle is verified, never
on a warm session, whose verification record stands)."""

from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path
from typing import Any

from epctx.errors import Untrusted

__all__ = ["Expected", "is_keyless", "verify_keyless"]

TRUSTED_ROOT_TYPE = "application/vnd.dev.sigstore.trustedroot+json;version=0.1"
CLIENT_CONFIG_TYPE = "application/vnd.dev.sigstore.clienttrustconfig.v0.1+json"


@dataclasses.dataclass(frozen=True)
class Expected:
    """What a keyless signature must show: the trusted root's file, the identity (SAN), the OIDC issuer."""

    root: str
    identity: str
    issuer: str


def is_keyless(material: dict[str, Any]) -> bool:
    """A bundle signed through sigstore's keyless flow: a transparency-log entry, or a single certificate
    (bundle v0.3) rather than a key hint or a certificate chain of the user's own PKI."""
    return bool(material.get("tlogEntries")) or "certificate" in material


def verify_keyless(
    raw: bytes, material: dict[str, Any], expected: Expected | None, where: str
) -> tuple[bytes, str]:
    """The DSSE payload of the keyless bundle ``raw`` once sigstore verified it offline against ``expected``, and
    who signed (identity, issuer); Untrusted otherwise, naming what is missing or what failed."""
    claimed = _claimed(material)
    if expected is None:
        raise Untrusted(
            f"{where} is a sigstore keyless signature ({claimed}); verifying it offline needs a sigstore trusted "
            "root and the identity and issuer to expect: set epctx.trust.sigstore_root (a trusted_root.json), "
            "epctx.trust.sigstore_identity and epctx.trust.sigstore_issuer"
        )
    try:
        from sigstore.errors import Error as SigstoreError
        from sigstore.models import Bundle
        from sigstore.verify import Verifier, policy
    except ImportError as exc:
        raise Untrusted(f"{where}: verifying a sigstore keyless signature needs the sigstore package "
                        "(pip install 'epctx[trust]')") from exc  # fmt: skip
    trusted_root = _trusted_root(expected.root)
    identity = policy.Identity(identity=expected.identity, issuer=expected.issuer)
    try:
        verifier = Verifier(trusted_root=trusted_root)
        bundle = Bundle.from_json(raw)
        payload_type, payload = verifier.verify_dsse(bundle=bundle, policy=identity)
    except (SigstoreError, ValueError) as exc:
        raise Untrusted(
            f"{where}: the sigstore keyless signature ({claimed}) does not verify against the trusted root "
            f"{expected.root!r} for identity {expected.identity!r} from issuer {expected.issuer!r}: {exc}"
        ) from exc
    if payload_type != "application/vnd.in-toto+json":
        raise Untrusted(f"{where}: a keyless signature over {payload_type!r}, not an in-toto statement")
    return payload, f"sigstore {expected.identity} ({expected.issuer})"


def _trusted_root(path: str) -> Any:
    """sigstore's TrustedRoot from ``path``: a trusted root, or a client trust config holding one."""
    from sigstore.errors import Error as SigstoreError
    from sigstore.models import ClientTrustConfig, TrustedRoot

    try:
        text = Path(path).read_text(encoding="utf-8")
        kind = json.loads(text).get("mediaType")
        if kind == CLIENT_CONFIG_TYPE:
            return ClientTrustConfig.from_json(text).trusted_root
        return TrustedRoot.from_file(path)
    except (OSError, ValueError, AttributeError, SigstoreError) as exc:
        raise Untrusted(
            f"epctx.trust.sigstore_root {path!r} is not a readable sigstore trusted root ({TRUSTED_ROOT_TYPE}) or "
            f"client trust config ({CLIENT_CONFIG_TYPE}): {exc}"
        ) from exc


def _claimed(material: dict[str, Any]) -> str:
    """Who the bundle's certificate says signed (not verified: for messages)."""
    raw = (material.get("certificate") or {}).get("rawBytes")
    if raw is None:
        chain = (material.get("x509CertificateChain") or {}).get("certificates") or [{}]
        raw = chain[0].get("rawBytes")
    try:
        from cryptography import x509

        cert = x509.load_der_x509_certificate(base64.b64decode(raw))
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        who = ", ".join(str(v) for v in (*names.get_values_for_type(x509.RFC822Name),
                                         *names.get_values_for_type(x509.UniformResourceIdentifier)))  # fmt: skip
    except Exception:  # a message only: any unreadable certificate says nothing
        return "certificate unreadable"
    return f"certificate for {who or 'no e-mail or URI'}, transparency-log entry"
