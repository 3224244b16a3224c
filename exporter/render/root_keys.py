"""Keys the exporter owns under every root, besides the ingresses' own objects.

- `_meta/owner`: a sentinel Traefik ignores; it also ends Traefik's empty-prefix backoff.
- `tls/stores/default/defaultCertificate/{certFile,keyFile}`: without it Traefik generates an
  RSA certificate on every reload (~10x the reload cost), and a root holding no http/tcp/tls
  object makes Traefik keep serving the last deleted route.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ..errors import ConfigError
from ..keys import BEACON_KEY, CERT_KEY, KEY_KEY, OWNER_KEY

OWNER_VALUE = "traefik-etcd-exporter"


@dataclass(frozen=True)
class DefaultCertificate:
    """A PEM certificate and key; `generated` ones are only written where none exists yet."""

    cert_pem: str
    key_pem: str
    generated: bool


def generate_certificate(common_name: str = "traefik-default") -> DefaultCertificate:
    """A self-signed ECDSA P-256 certificate valid for ten years."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .sign(key, hashes.SHA256())
    )
    return DefaultCertificate(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM).decode(),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode(),
        generated=True,
    )


def load_certificate(cert_file: Path | None, key_file: Path | None) -> DefaultCertificate:
    """The operator's certificate when both files are configured, else a generated one."""
    if cert_file is not None and key_file is not None:
        try:
            return DefaultCertificate(cert_file.read_text(), key_file.read_text(), generated=False)
        except OSError as exc:
            raise ConfigError(f"tls.cert_file/tls.key_file: cannot read {exc.filename}: {exc.strerror}") from None
    return generate_certificate()


def root_keys(root: str, certificate: DefaultCertificate) -> dict[str, str]:
    """The keys the exporter keeps under `root` for as long as it manages that root."""
    return {
        f"{root}/{OWNER_KEY}": OWNER_VALUE,
        f"{root}/{CERT_KEY}": certificate.cert_pem,
        f"{root}/{KEY_KEY}": certificate.key_pem,
        f"{root}/{BEACON_KEY}": beacon_value(root, "0"),
    }


def beacon_value(root: str, token: str) -> str:
    """What a root's beacon holds: the root (a Traefik reads one) and the writing transaction's token."""
    return f"{root} {token}"
