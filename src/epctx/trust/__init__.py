"""Trust: OpenSSF model signing over context folders, and the load policy checked before any backend sees a byte.

- ``certificates``: a bundle's certificate chain checked (issuers, validity now, key usage).
- ``keyless``: sigstore keyless bundles verified offline against a user-supplied trusted root (sigstore-python).
- ``bundle``: read a model_signing signature (a sigstore bundle v0.3 holding a DSSE envelope over an in-toto
  statement of file digests) and verify it with trusted EC public keys or certificates. Imports
  ``cryptography`` only when a signature is actually verified; never ``model_signing`` (245 ms of imports).
- ``digests``: SHA-256 of files at hashing speed, and the manifest comparison.
- ``record``: what was verified, kept per user (inode + ctime + size of every file involved), so a warm
  session does not hash again; any write to a covered file, the signature or a key invalidates it.
- ``policy``: ``epctx.trust.policy`` off | warn | require | require-native, applied to a context model's files,
  and which payloads carry native code (``require-native``).
- ``sign``: signing a folder in model_signing's format (with the ``model_signing`` package: ``trust`` extra).

With the policy off (the default) the load path imports nothing of this package."""

from __future__ import annotations

__all__: list[str] = []
