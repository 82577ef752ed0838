"""The gRPC server's certificate: given, or made at start (self-signed, as GIE's EPP does).

Gateways connect to an endpoint picker over TLS without verifying it (GIE's Envoy
configuration skips the check), so a certificate made at start is enough to keep the
request bodies off the wire in clear; ``--cert-path`` / ``--key-path`` give one of your own,
``--plaintext`` none at all.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VALID_DAYS = 365


def self_signed(name: str = "cache-router-epp") -> tuple[bytes, bytes]:
    """A fresh P-256 key and a certificate for it (PEM): ``(key, certificate)``."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def key_and_certificate(cert_path: str | None, key_path: str | None) -> tuple[bytes, bytes]:
    """The given PEM files, else a self-signed pair made now."""
    if cert_path and key_path:
        return Path(key_path).read_bytes(), Path(cert_path).read_bytes()
    if cert_path or key_path:
        raise ValueError("--cert-path and --key-path go together")
    return self_signed()
