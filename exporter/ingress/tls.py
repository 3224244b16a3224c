"""TLS on both sides of Traefik: towards the upstream (`upstream_tls`) and on the router (`tls`)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field, StrictStr, field_validator

from .bounds import MAX_CA_PEM_BYTES, MAX_HOSTS, MAX_TLS_DOMAINS
from .values import HostName, Strict

_RESOLVER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
_TLS_OPTIONS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}(@[a-z0-9-]{1,63})?\Z")


def _resolver(value: str) -> str:
    if not _RESOLVER_RE.match(value):
        raise ValueError("must be a certificate resolver name of [A-Za-z0-9_-]")
    return value


def _tls_options(value: str) -> str:
    if not _TLS_OPTIONS_RE.match(value):
        raise ValueError("must be a TLS options name, optionally @<provider>")
    return value


class TlsDomain(Strict):
    """A certificate domain: `main` and its subject alternative names."""

    main: HostName
    sans: list[HostName] = Field(default_factory=list, max_length=MAX_HOSTS)


class RouterTls(Strict):
    """TLS termination on the router: a certificate resolver, its domains, TLS options."""

    cert_resolver: Annotated[StrictStr, AfterValidator(_resolver)] | None = None
    domains: list[TlsDomain] = Field(default_factory=list, max_length=MAX_TLS_DOMAINS)
    options: Annotated[StrictStr, AfterValidator(_tls_options)] | None = None


class UpstreamTls(Strict):
    """TLS towards the upstream: the CA that signed it and the name to verify."""

    ca_pem: str | None = Field(default=None, max_length=MAX_CA_PEM_BYTES)
    server_name: HostName | None = None
    insecure_skip_verify: bool = False

    @field_validator("ca_pem")
    @classmethod
    def _pem(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from cryptography import x509

        try:
            certs = x509.load_pem_x509_certificates(value.encode())
        except ValueError:
            raise ValueError("must be one or more PEM certificates") from None
        if not certs:
            raise ValueError("must be one or more PEM certificates")
        return value
