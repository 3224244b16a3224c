"""The ingress model: the one shape shared by the push API and ingress files.

Every string that can reach a Traefik rule or an etcd key is validated here so that it
can inject neither rule syntax (backticks, quotes, `||`, parentheses) nor a key segment
(`/`), and no list element carries a comma (Traefik joins simple lists with `,`).
Every list has an upper bound so no request can make the exporter do unbounded work.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal, Union
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
    ValidationError,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from .keys import IngressRef

# Bounds (documented in docs/ingress.md).
MAX_HOSTS = 32
MAX_SERVERS = 256
MAX_INSTANCES = 64
MAX_ENTRYPOINTS = 16
MAX_ALLOWED_IPS = 64
MAX_HEADERS = 32
MAX_INGRESSES_PER_REQUEST = 1000
MAX_CA_PEM_BYTES = 64 * 1024

_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
_HOST_LABEL_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
_PATH_RE = re.compile(r"^/[A-Za-z0-9._~%+=:@/-]{0,255}\Z")
_ENTRYPOINT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
_HEADER_NAME_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}\Z")
_HEADER_VALUE_RE = re.compile(r"^[\x20-\x7e\t]{0,4096}\Z")


def _dns_label(value: str) -> str:
    if not _DNS_LABEL_RE.match(value):
        raise ValueError("must be a DNS label: 1-63 of [a-z0-9-], lowercase, not starting or ending with '-'")
    if value.isdigit():
        raise ValueError("must not be all digits (Traefik decodes a numeric name as a list index)")
    return value


def _hostname(value: str) -> str:
    if len(value) > 253:
        raise ValueError("must be at most 253 characters")
    labels = value.split(".")
    wildcard = labels[0] == "*"
    for label in labels[1:] if wildcard else labels:
        if not _HOST_LABEL_RE.match(label):
            raise ValueError(
                "must be an RFC 1123 host name: lowercase labels of [a-z0-9-] separated by '.'"
            )
    if wildcard and len(labels) < 3:
        raise ValueError("a wildcard host needs at least two labels after '*.'")
    return value


def _path(value: str) -> str:
    if not _PATH_RE.match(value):
        raise ValueError(
            "must start with '/' and contain only [A-Za-z0-9._~%+=:@/-] (at most 256 characters)"
        )
    return value


def validate_entrypoint(value: str) -> str:
    """An entrypoint name (also used for the config's default_entrypoints)."""
    if not _ENTRYPOINT_RE.match(value):
        raise ValueError("must be an entrypoint name of [A-Za-z0-9_-] (at most 64 characters)")
    return value


def _cidr(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        raise ValueError("must be an IP address or CIDR range such as 10.0.0.0/8") from None


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
# A server's share of its group: an integer, or a ratio such as Backend.AI's traffic_ratio (0.7);
# 0 sends it no traffic. Rendered as Traefik's integer weights (render/renderer.py).
Weight = Annotated[Union[StrictInt, StrictFloat], Field(ge=0, le=1_000_000, allow_inf_nan=False)]


def _authority(value: str) -> str:
    if not value:
        raise ValueError("must not be empty")
    if "/" in value:
        raise ValueError("must not contain '/' (it is one segment of the etcd keys)")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError("must not contain control characters")
    if len(value.encode()) > 253:
        raise ValueError("must be at most 253 bytes")
    return value


# Backend.AI's authority is free text: kept verbatim in keys, mapped to a safe label in object names (keys.py).
Authority = Annotated[StrictStr, AfterValidator(_authority)]
HostName = Annotated[str, AfterValidator(_hostname)]
UrlPath = Annotated[str, AfterValidator(_path)]
EntryPoint = Annotated[str, AfterValidator(validate_entrypoint)]
Cidr = Annotated[str, AfterValidator(_cidr)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


_SIMPLE_URL_RE = re.compile(
    r"^(?P<scheme>[a-z]+)://(?P<host>(?:\d{1,3}\.){3}\d{1,3}|[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?):(?P<port>\d{1,5})/?\Z"
)


def parse_upstream_url(value: str, schemes: tuple[str, ...]) -> tuple[str, str, int]:
    """Split a server URL into (scheme, host, port); raise ValueError naming what is wrong."""
    simple = _SIMPLE_URL_RE.match(value)
    if simple and simple["scheme"] in schemes and 0 < int(simple["port"]) < 65536:
        # The common case (scheme://ipv4-or-name:port), checked without urlsplit.
        host = simple["host"]
        if host[0].isdigit() and host.replace(".", "").isdigit():
            # Four octets (the pattern), each 0-255 without a leading zero: what ip_address accepts.
            if any(int(octet) > 255 or (octet[0] == "0" and octet != "0") for octet in host.split(".")):
                raise ValueError(f"{host} is not a valid IP address")
        else:
            _hostname(host)
        return simple["scheme"], host, int(simple["port"])
    if any(c in value for c in "`\"'(),|\\ \t\r\n"):
        raise ValueError("must not contain quotes, backticks, parentheses, '|', ',' or whitespace")
    parts = urlsplit(value)
    if parts.scheme not in schemes:
        raise ValueError(f"scheme must be one of {', '.join(schemes)}")
    if parts.username or parts.password:
        raise ValueError("must not carry credentials")
    if parts.query or parts.fragment:
        raise ValueError("must not carry a query or fragment")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("port must be a number in 1-65535") from None
    host = parts.hostname
    if not host or port is None or port == 0:
        raise ValueError("must have a host and an explicit port, e.g. http://10.0.0.5:8000")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        _hostname(host)
    if parts.path not in ("", "/"):
        _path(parts.path)
    return parts.scheme, host, port


class Server(_Strict):
    """One upstream server."""

    url: str = Field(max_length=512)
    weight: Weight = 1

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parse_upstream_url(value, ("http", "https", "tcp"))
        return value


class ServersUpstream(_Strict):
    """`kind: servers`: a plain list of servers."""

    kind: Literal["servers"] = "servers"
    servers: list[Server] = Field(min_length=1, max_length=MAX_SERVERS)

    @field_validator("servers")
    @classmethod
    def _unique(cls, value: list[Server]) -> list[Server]:
        return _unique_urls(value)


def _unique_urls(servers: list[Server]) -> list[Server]:
    if len({s.url for s in servers}) != len(servers):
        raise ValueError("server urls must be unique")
    return servers


class InstanceChecks(_Strict):
    """Per-instance health check overrides of an `ai-proxy-multi` instance."""

    path: UrlPath | None = None
    headers: dict[str, str] = Field(default_factory=dict, max_length=MAX_HEADERS)
    interval: float | None = Field(default=None, gt=0, le=3600)
    max_retries: int | None = Field(default=None, ge=1, le=100)
    max_wait_time: float | None = Field(default=None, gt=0, le=300)
    expected_status_code: int | None = Field(default=None, ge=100, le=599)

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, header in value.items():
            if not _HEADER_NAME_RE.match(name):
                raise ValueError(f"header name {name!r} is not an HTTP token")
            if not _HEADER_VALUE_RE.match(header):
                raise ValueError(f"header {name!r} value must be printable ASCII without CR/LF")
        return value


class Instance(_Strict):
    """One named instance of an `ai-proxy-multi` upstream."""

    name: DnsLabel
    url: str = Field(max_length=512)
    weight: Weight = 1
    checks: InstanceChecks | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parse_upstream_url(value, ("http", "https"))
        return value


class AiProxyMultiUpstream(_Strict):
    """`kind: ai-proxy-multi`: named instances, each checked on its own."""

    kind: Literal["ai-proxy-multi"]
    instances: list[Instance] = Field(min_length=1, max_length=MAX_INSTANCES)

    @field_validator("instances")
    @classmethod
    def _unique(cls, value: list[Instance]) -> list[Instance]:
        names = [i.name for i in value]
        if len(set(names)) != len(names):
            raise ValueError("instance names must be unique")
        return value


_PLUGIN_KIND_RE = re.compile(r"^[a-z][a-z0-9-]{0,62}\Z")
_ConfigValue = Union[StrictStr, StrictInt, StrictFloat, StrictBool]


class PluginUpstream(_Strict):
    """A third-party `kind`: servers rendered as a load balancer, checked by the kind's plugin.

    `config` is the plugin's own settings (flat, at most 32 entries); that a plugin for the kind
    is installed is checked when the ingress is accepted (docs/plugins.md).
    """

    kind: str
    servers: list[Server] = Field(min_length=1, max_length=MAX_SERVERS)
    config: dict[str, _ConfigValue] = Field(default_factory=dict, max_length=32)

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        if not _PLUGIN_KIND_RE.match(value) or value in ("servers", "ai-proxy-multi"):
            raise ValueError("must be servers, ai-proxy-multi or a plugin kind of [a-z0-9-]")
        return value

    @field_validator("servers")
    @classmethod
    def _unique(cls, value: list[Server]) -> list[Server]:
        return _unique_urls(value)


def _upstream_tag(value: Any) -> str:
    kind = value.get("kind", "servers") if isinstance(value, dict) else getattr(value, "kind", "servers")
    return kind if kind in ("servers", "ai-proxy-multi") else "plugin"


Upstream = Annotated[
    Union[
        Annotated[ServersUpstream, Tag("servers")],
        Annotated[AiProxyMultiUpstream, Tag("ai-proxy-multi")],
        Annotated[PluginUpstream, Tag("plugin")],
    ],
    Discriminator(_upstream_tag),
]


def _default_kind(value: Any) -> Any:
    # `kind` defaults to `servers`.
    if isinstance(value, dict) and "kind" not in value:
        return {"kind": "servers", **value}
    return value


class Canary(_Strict):
    """A weighted split: `weight` percent of traffic goes to the canary upstream."""

    weight: int = Field(ge=1, le=99)
    upstream: Upstream

    @field_validator("upstream", mode="before")
    @classmethod
    def _kind(cls, value: Any) -> Any:
        return _default_kind(value)


class HealthCheck(_Strict):
    """Active health check, with Backend.AI `ModelHealthCheck` names, defaults and range.

    Every value `ModelHealthCheck` accepts is accepted (snake_case or its kebab-case aliases);
    edge values get the meanings documented in docs/ingress.md (`max_retries: 0` ejects on
    the first failure; an `interval` or `max_wait_time` below 0.1 s counts as 0.1 s).
    """

    enable: bool = False
    path: UrlPath = "/health"
    interval: float = Field(default=10.0, allow_inf_nan=False)
    max_retries: int = Field(default=10, validation_alias=AliasChoices("max_retries", "max-retries"))
    max_wait_time: float = Field(
        default=15.0, allow_inf_nan=False, validation_alias=AliasChoices("max_wait_time", "max-wait-time")
    )
    expected_status_code: int = Field(
        default=200, gt=100, validation_alias=AliasChoices("expected_status_code", "expected-status-code")
    )
    initial_delay: float = Field(
        default=60.0, ge=0, allow_inf_nan=False, validation_alias=AliasChoices("initial_delay", "initial-delay")
    )


class UpstreamTls(_Strict):
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


_MIDDLEWARE_REF_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}@[a-z0-9-]{1,63}\Z")
_RESOLVER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
_TLS_OPTIONS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}(@[a-z0-9-]{1,63})?\Z")
MAX_MIDDLEWARES = 16
MAX_TLS_DOMAINS = 16


def _middleware_ref(value: str) -> str:
    if not _MIDDLEWARE_REF_RE.match(value):
        raise ValueError("must be <name>@<provider> (e.g. cors@file): [A-Za-z0-9_-] then '@' and a lowercase provider")
    return value


def _resolver(value: str) -> str:
    if not _RESOLVER_RE.match(value):
        raise ValueError("must be a certificate resolver name of [A-Za-z0-9_-]")
    return value


def _tls_options(value: str) -> str:
    if not _TLS_OPTIONS_RE.match(value):
        raise ValueError("must be a TLS options name, optionally @<provider>")
    return value


class TlsDomain(_Strict):
    """A certificate domain: `main` and its subject alternative names."""

    main: HostName
    sans: list[HostName] = Field(default_factory=list, max_length=MAX_HOSTS)


class RouterTls(_Strict):
    """TLS termination on the router: a certificate resolver, its domains, TLS options."""

    cert_resolver: Annotated[StrictStr, AfterValidator(_resolver)] | None = None
    domains: list[TlsDomain] = Field(default_factory=list, max_length=MAX_TLS_DOMAINS)
    options: Annotated[StrictStr, AfterValidator(_tls_options)] | None = None


class IpStrategy(_Strict):
    """How the client IP is found behind load balancers: the `depth`-th address from the right of
    X-Forwarded-For, skipping `excluded_ips` (Traefik's ipAllowList.ipStrategy)."""

    depth: int = Field(default=0, ge=0, le=64)
    excluded_ips: list[Cidr] = Field(default_factory=list, max_length=MAX_ALLOWED_IPS)


# Fields added after records were first stored: left out of the canonical JSON while unset, so a
# stored record keeps its exact bytes (no rewrite on upgrade).
_OPTIONAL_LATER = ("tls", "middlewares", "allowed_client_ips_strategy")


class Ingress(_Strict):
    """One route: where traffic for some hosts/path goes, and how it is checked."""

    authority: Authority
    id: DnsLabel
    revision: int = Field(ge=0, le=2**63 - 1)
    protocol: Literal["http", "tcp"] = "http"
    hosts: list[HostName] = Field(default_factory=list, max_length=MAX_HOSTS)
    path_prefix: UrlPath = "/"
    entrypoints: list[EntryPoint] | None = Field(default=None, min_length=1, max_length=MAX_ENTRYPOINTS)
    upstream: Upstream
    canary: Canary | None = None
    health_check: HealthCheck = Field(default_factory=HealthCheck)
    allowed_client_ips: list[Cidr] | None = Field(default=None, min_length=1, max_length=MAX_ALLOWED_IPS)
    upstream_tls: UpstreamTls | None = None
    tls: StrictBool | RouterTls | None = None
    middlewares: list[Annotated[StrictStr, AfterValidator(_middleware_ref)]] | None = Field(
        default=None, min_length=1, max_length=MAX_MIDDLEWARES
    )
    allowed_client_ips_strategy: IpStrategy | None = None

    @model_serializer(mode="wrap")
    def _canonical(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in _OPTIONAL_LATER:
            if data.get(name) is None:
                data.pop(name, None)
        return data

    @field_validator("upstream", mode="before")
    @classmethod
    def _kind(cls, value: Any) -> Any:
        return _default_kind(value)

    @field_validator("revision", mode="before")
    @classmethod
    def _int_revision(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("must be an integer")
        return value

    @model_validator(mode="after")
    def _protocol_rules(self) -> Ingress:
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
            for name in ("upstream_tls", "tls", "middlewares"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: not supported for tcp ingresses")
        if self.allowed_client_ips_strategy is not None and self.allowed_client_ips is None:
            raise ValueError("allowed_client_ips_strategy: needs allowed_client_ips")
        if len(set(self.hosts)) != len(self.hosts):
            raise ValueError("hosts: must be unique")
        return self

    @property
    def key(self) -> IngressRef:
        """(authority, id): the identity of the ingress."""
        return IngressRef(self.authority, self.id)


def _servers_of(ingress: Ingress) -> list[str]:
    urls: list[str] = []
    for upstream in (ingress.upstream, ingress.canary.upstream if ingress.canary else None):
        if isinstance(upstream, (ServersUpstream, PluginUpstream)):
            urls.extend(s.url for s in upstream.servers)
        elif isinstance(upstream, AiProxyMultiUpstream):
            urls.extend(i.url for i in upstream.instances)
    return urls


class IngressFile(_Strict):
    """The top-level shape of an ingress file (bounded by `sources.max_file_bytes`, not by a count)."""

    ingresses: list[Ingress]

    @field_validator("ingresses")
    @classmethod
    def _unique(cls, value: list[Ingress]) -> list[Ingress]:
        seen: set[IngressRef] = set()
        for ingress in value:
            if ingress.key in seen:
                raise ValueError(f"ingress {ingress.authority}/{ingress.id} appears more than once")
            seen.add(ingress.key)
        return value


class UpsertRequest(IngressFile):
    """The body of `POST /v2/ingress/upsert`."""

    ingresses: list[Ingress] = Field(max_length=MAX_INGRESSES_PER_REQUEST)


class RemoveItem(_Strict):
    """What a remove request names; without `revision` whatever is stored is removed."""

    authority: Authority
    id: DnsLabel
    revision: int | None = Field(default=None, ge=0, le=2**63 - 1)


class RemoveRequest(_Strict):
    """The body of `POST /v2/ingress/remove`."""

    ingresses: list[RemoveItem] = Field(max_length=MAX_INGRESSES_PER_REQUEST)


def field_errors(error: ValidationError) -> list[dict[str, str]]:
    """Every field error as `{"loc": "ingresses.0.hosts.1", "msg": ...}`; input values are never echoed."""
    out = []
    for item in error.errors(include_input=False, include_url=False):
        loc = ".".join(str(p) for p in item["loc"])
        msg = item["msg"].removeprefix("Value error, ")
        out.append({"loc": loc, "msg": msg})
    return out
