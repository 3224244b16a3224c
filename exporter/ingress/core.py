"""The core shape of an ingress: the one model shared by the push API and ingress files.

Every string that can reach a Traefik rule or an etcd key is validated (values.py) so that
it can inject neither rule syntax nor a key segment, and no list element carries a comma
(Traefik joins simple lists with `,`). Every list has an upper bound (bounds.py).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictBool, ValidationInfo, field_validator, model_validator

from ..keys import IngressRef
from .bounds import MAX_ALLOWED_IPS, MAX_ENTRYPOINTS, MAX_HOSTS, MAX_MIDDLEWARES
from .edge import MAX_BLOCKED_SEGMENTS, MAX_PATHS, Limits, PathRule, Profile, Retry, Segment, Timeouts
from .health import HealthCheck
from .routing import IpStrategy, MiddlewareRef
from .tls import RouterTls, UpstreamTls
from .upstreams import AiProxyMultiUpstream, Canary, PluginUpstream, ServersUpstream, Upstream, default_kind
from .values import Authority, Cidr, DnsLabel, EntryPoint, HostName, Integer, Strict, UrlPath, admitting, shared, unset

_DEFAULT_CHECK = HealthCheck()
# The model-serving edge (edge.py): http only.
_EDGE = ("timeouts", "keepalive", "profile", "paths", "blocked_segments", "limits", "retry")


class Ingress(Strict):
    """One route: where traffic for some hosts/path goes, and how it is checked."""

    authority: Authority
    id: DnsLabel
    revision: Integer = Field(ge=0, le=2**63 - 1)
    protocol: Literal["http", "tcp"] = "http"
    hosts: list[HostName] = Field(default_factory=list, max_length=MAX_HOSTS)
    path_prefix: UrlPath = "/"
    entrypoints: list[EntryPoint] | None = Field(default=None, min_length=1, max_length=MAX_ENTRYPOINTS)
    upstream: Upstream
    canary: Canary | None = None
    health_check: HealthCheck = Field(default_factory=lambda: _DEFAULT_CHECK)
    allowed_client_ips: list[Cidr] | None = Field(default=None, min_length=1, max_length=MAX_ALLOWED_IPS)
    upstream_tls: UpstreamTls | None = None
    # The fields below were added after records were first stored: left out while unset (`unset`).
    tls: StrictBool | RouterTls | None = Field(default=None, exclude_if=unset)
    middlewares: list[MiddlewareRef] | None = Field(default=None, min_length=1, max_length=MAX_MIDDLEWARES, exclude_if=unset)
    allowed_client_ips_strategy: IpStrategy | None = Field(default=None, exclude_if=unset)
    timeouts: Timeouts | None = Field(default=None, exclude_if=unset)
    keepalive: StrictBool | None = Field(default=None, exclude_if=unset)
    profile: Profile | None = Field(default=None, exclude_if=unset)
    paths: list[PathRule] | None = Field(default=None, min_length=1, max_length=MAX_PATHS, exclude_if=unset)
    blocked_segments: list[Segment] | None = Field(default=None, min_length=1, max_length=MAX_BLOCKED_SEGMENTS, exclude_if=unset)
    limits: Limits | None = Field(default=None, exclude_if=unset)
    retry: Retry | None = Field(default=None, exclude_if=unset)

    @field_validator("upstream", mode="before")
    @classmethod
    def _kind(cls, value: Any) -> Any:
        return default_kind(value)

    @field_validator("health_check", "timeouts", "limits", "retry", "upstream_tls")
    @classmethod
    def _shared(cls, value: Strict | None) -> Strict | None:
        return shared(value) if value is not None else None

    @field_validator("revision", mode="before")
    @classmethod
    def _int_revision(cls, value: Any) -> Any:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("must be an integer")
        return value

    @model_validator(mode="after")
    def _protocol_rules(self, info: ValidationInfo) -> Ingress:
        if self.protocol == "http":
            if not self.hosts:
                raise ValueError("hosts: an http ingress needs at least one host")
            for server in _servers_of(self):
                if not server.startswith(("http://", "https://")):
                    raise ValueError(f"upstream: http ingress server {server!r} needs an http(s) URL")
        else:
            if self.path_prefix != "/":
                raise ValueError("path_prefix: a tcp ingress cannot route by path")
            if self.upstream.kind != "servers" or (self.canary and self.canary.upstream.kind != "servers"):
                raise ValueError("upstream: a tcp ingress needs kind 'servers'")
            for server in _servers_of(self):
                if not server.startswith("tcp://"):
                    raise ValueError(f"upstream: tcp ingress server {server!r} needs a tcp://host:port URL")
            for upstream in (self.upstream, self.canary.upstream if self.canary else None):
                if isinstance(upstream, ServersUpstream) and any(s.weight != 1 for s in upstream.servers):
                    raise ValueError("upstream: Traefik cannot weight tcp servers; use canary for a weighted split")
            for name in ("upstream_tls", "tls", "middlewares", *_EDGE):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: not supported for tcp ingresses")
        if admitting(info):
            _refuse_what_has_no_effect(self)
        if self.allowed_client_ips_strategy is not None and self.allowed_client_ips is None:
            raise ValueError("allowed_client_ips_strategy: needs allowed_client_ips")
        if len(set(self.hosts)) != len(self.hosts):
            raise ValueError("hosts: must be unique")
        if (self.paths is not None or self.profile is not None) and self.path_prefix != "/":
            raise ValueError("path_prefix: paths and profile replace path_prefix; leave it out")
        return self

    @property
    def key(self) -> IngressRef:
        """(authority, id): the identity of the ingress."""
        return IngressRef(self.authority, self.id)

    @property
    def ca_file(self) -> str | None:
        """The upstream CA file it names (`upstream_tls.ca_file`), if any."""
        return self.upstream_tls.ca_file if self.upstream_tls is not None else None


def _refuse_what_has_no_effect(ingress: Ingress) -> None:
    """Combinations Traefik (or the health engine) would ignore, refused on new input only: a
    record stored before they were refused still loads and renders as it did."""
    if ingress.protocol == "http":
        if ingress.upstream_tls is not None and not any(u.startswith("https://") for u in _servers_of(ingress)):
            raise ValueError("upstream_tls: no server is https://; TLS towards the upstream applies only to https:// servers")
        # Traefik reads a router's tls.domains only in its certificate resolvers (ACME, Tailscale).
        if isinstance(ingress.tls, RouterTls) and ingress.tls.domains and ingress.tls.cert_resolver is None:
            raise ValueError("tls.domains: only a cert_resolver reads them; set tls.cert_resolver or leave domains out")
        return
    if ingress.allowed_client_ips_strategy is not None:
        raise ValueError(
            "allowed_client_ips_strategy: not supported for tcp ingresses (Traefik matches a tcp client "
            "by its connection's address; there is no X-Forwarded-For to choose from)"
        )
    # A tcp server is checked by a TCP connect: no request path, no status code.
    for name in ("path", "expected_status_code"):
        if getattr(ingress.health_check, name) != getattr(_DEFAULT_CHECK, name):
            raise ValueError(f"health_check.{name}: a tcp ingress is checked by a TCP connect; leave {name} at its default")


def _servers_of(ingress: Ingress) -> list[str]:
    urls: list[str] = []
    for upstream in (ingress.upstream, ingress.canary.upstream if ingress.canary else None):
        if isinstance(upstream, (ServersUpstream, PluginUpstream)):
            urls.extend(s.url for s in upstream.servers)
        elif isinstance(upstream, AiProxyMultiUpstream):
            urls.extend(i.url for i in upstream.instances)
    return urls
