"""Schemathesis hooks for the push API fuzz test: the formats the contract names that it cannot draw by itself."""

from __future__ import annotations

import datetime

import schemathesis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import strategies as st


def _certificate(name: str) -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


_PEMS = [_certificate(f"fuzz-ca-{n}") for n in range(3)]
schemathesis.openapi.format("pem-certificates", st.sampled_from(_PEMS))
