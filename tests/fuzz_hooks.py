"""Schemathesis hooks for the push API fuzz test: the formats the contract names that it cannot draw by itself."""

from __future__ import annotations

import datetime
import os
from typing import Any

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


def _unique(items: list[Any], key: str) -> list[Any]:
    seen: set[Any] = set()
    kept = []
    for item in items:
        if not isinstance(item, dict) or item.get(key) not in seen:
            kept.append(item)
            seen.add(item.get(key) if isinstance(item, dict) else None)
    return kept


def _unique_members(upstream: Any) -> None:
    if isinstance(upstream, dict):
        for members, key in (("servers", "url"), ("instances", "name")):
            if isinstance(upstream.get(members), list):
                upstream[members] = _unique(upstream[members], key)


@schemathesis.hook
def map_body(_context: Any, body: Any) -> Any:
    """With FUZZ_UNIQUE set (positive mode): the uniqueness rules JSON Schema cannot say (server urls and
    instance names within a group, ingresses within a request), kept as a coordinator's client keeps them."""
    if not os.environ.get("FUZZ_UNIQUE") or not isinstance(body, dict) or not isinstance(body.get("ingresses"), list):
        return body
    ingresses = [i for i in body["ingresses"] if isinstance(i, dict)]
    for ingress in ingresses:
        _unique_members(ingress.get("upstream"))
        if isinstance(ingress.get("canary"), dict):
            _unique_members(ingress["canary"].get("upstream"))
    by_key = {(i.get("authority"), i.get("id")): i for i in reversed(ingresses)}
    body["ingresses"] = list(reversed(by_key.values()))
    return body
