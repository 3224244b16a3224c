"""TLS on both sides of Traefik: towards the upstream (`upstream_tls`) and on the router (`tls`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, StrictStr, field_validator, model_validator

from .bounds import MAX_CA_PEM_BYTES, MAX_HOSTS, MAX_TLS_DOMAINS
from .values import HostName, Published, Strict, pattern, unset

_RESOLVER = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
_TLS_OPTIONS = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}(@[a-z0-9-]{1,63})?$"
_CA_FILE = "^(/[^/\\x00-\\x1f\\x7f]+)+$"
_RESOLVER_RE = pattern(_RESOLVER)
_TLS_OPTIONS_RE = pattern(_TLS_OPTIONS)


def _resolver(value: str) -> str:
    if not _RESOLVER_RE.fullmatch(value):
        raise ValueError("must be a certificate resolver name of [A-Za-z0-9_-]")
    return value


def _tls_options(value: str) -> str:
    if not _TLS_OPTIONS_RE.fullmatch(value):
        raise ValueError("must be a TLS options name, optionally @<provider>")
    return value


class TlsDomain(Strict):
    """A certificate domain: `main` and its subject alternative names."""

    main: HostName
    sans: list[HostName] = Field(default_factory=list, max_length=MAX_HOSTS)


class RouterTls(Strict):
    """TLS termination on the router: a certificate resolver, its domains, TLS options."""

    cert_resolver: Annotated[StrictStr, AfterValidator(_resolver), Published(pattern=_RESOLVER)] | None = None
    domains: Annotated[list[TlsDomain], Published(description="read only by a cert_resolver: needs one")] = Field(
        default_factory=list, max_length=MAX_TLS_DOMAINS
    )
    options: Annotated[StrictStr, AfterValidator(_tls_options), Published(pattern=_TLS_OPTIONS)] | None = None


def _ca_file(value: str) -> str:
    if not value.startswith("/") or any(p in ("", ".", "..") for p in value[1:].split("/")):
        raise ValueError("must be an absolute path without '.', '..' or empty segments")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError("must not contain control characters")
    return value


class UpstreamTls(Strict):
    """TLS towards the upstream: the CA that signed it (`ca_pem`, or `ca_file`, watched) and the name to verify."""

    ca_pem: Annotated[str, Published(format="pem-certificates", description="one or more PEM certificates (not with ca_file)")] | None = (
        Field(default=None, max_length=MAX_CA_PEM_BYTES)
    )
    server_name: HostName | None = None
    insecure_skip_verify: bool = False
    # A file on the sidecar (under `upstream.ca_file_dirs`): read, watched, rewritten when it rotates.
    ca_file: Annotated[
        StrictStr, Field(max_length=1024), AfterValidator(_ca_file),
        Published(pattern=_CA_FILE, **{"not": {"pattern": "(^|/)\\.\\.?(/|$)"}}, description=(
            "absolute path of a PEM file under upstream.ca_file_dirs on the sidecar (refused when none is configured);"
            " watched, rewritten when it rotates (not with ca_pem)"
        )),
    ] | None = Field(default=None, exclude_if=unset)

    @model_validator(mode="after")
    def _one_ca(self) -> UpstreamTls:
        if self.ca_pem is not None and self.ca_file is not None:
            raise ValueError("ca_file: give ca_pem or ca_file, not both")
        return self

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
