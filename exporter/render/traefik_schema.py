"""Pydantic models of the Traefik dynamic-configuration objects templates may produce.

A rendered fragment is validated against these before it is flattened: one wrong type or
one unknown field under a root makes Traefik's KV provider refuse every later update
(docs/key-layout.md, "Decoder traps handled"), so nothing that fails here is ever written. Types are strict:
`priority: "abc"` or `weight: "1"` is rejected rather than coerced.

`max_length` on a list field also fixes the zero-padding width of its key indices.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    model_validator,
)

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,127}\Z")
_REF_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}(@[a-z0-9-]+)?\Z")
_DURATION_RE = re.compile(r"^(?:(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+|\d+)\Z")


def _object_name(value: str) -> str:
    if not _NAME_RE.match(value):
        raise ValueError(f"object name {value!r} must be lowercase [a-z0-9_-], without '@'")
    if value.isdigit():
        raise ValueError(f"object name {value!r} must not be all digits")
    return value


def _reference(value: str) -> str:
    if not _REF_RE.match(value) or value.split("@")[0].isdigit():
        raise ValueError(f"reference {value!r} is not a valid Traefik object name")
    return value


def _duration(value: str) -> str:
    if not _DURATION_RE.match(value):
        raise ValueError(f"duration {value!r} must look like 10s, 100ms or a number of seconds")
    return value


def _no_comma(value: str) -> str:
    if "," in value:
        raise ValueError(f"list element {value!r} must not contain ',' (Traefik splits simple lists on it)")
    return value


def _rule(value: str) -> str:
    if "\n" in value or "\r" in value:
        raise ValueError("rule must be one line")
    return value


Name = Annotated[StrictStr, AfterValidator(_object_name)]
Ref = Annotated[StrictStr, AfterValidator(_reference)]
Duration = Annotated[StrictStr, AfterValidator(_duration)]
ListStr = Annotated[StrictStr, AfterValidator(_no_comma)]
Rule = Annotated[StrictStr, Field(min_length=1, max_length=16384), AfterValidator(_rule)]


class _T(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _exactly_one(model: BaseModel, kind: str) -> None:
    present = [name for name in type(model).model_fields if getattr(model, name) is not None]
    if len(present) != 1:
        raise ValueError(f"a {kind} needs exactly one of {', '.join(type(model).model_fields)}")


class TlsDomain(_T):
    main: ListStr
    sans: list[ListStr] | None = Field(default=None, max_length=32)


class RouterTls(_T):
    options: Ref | None = None
    certResolver: Ref | None = None
    domains: list[TlsDomain] | None = Field(default=None, max_length=16)


class HttpRouter(_T):
    rule: Rule
    service: Ref
    entryPoints: list[ListStr] | None = Field(default=None, max_length=16)
    middlewares: list[Ref] | None = Field(default=None, max_length=32)
    priority: StrictInt | None = Field(default=None, ge=0, le=2**62)
    # `true`: TLS with the default certificate (Traefik reads a bare `tls` key as an empty section).
    tls: RouterTls | Literal[True] | None = None


class LbServer(_T):
    url: Annotated[StrictStr, Field(min_length=1, max_length=512)]
    weight: StrictInt | None = Field(default=None, ge=0)


class ResponseForwarding(_T):
    flushInterval: Duration | None = None


class LoadBalancer(_T):
    servers: list[LbServer] = Field(max_length=256)
    passHostHeader: StrictBool | None = None
    serversTransport: Ref | None = None
    strategy: Literal["wrr", "p2c"] | None = None
    responseForwarding: ResponseForwarding | None = None


class WeightedRef(_T):
    name: Ref
    weight: StrictInt = Field(ge=0)


class Weighted(_T):
    services: list[WeightedRef] = Field(min_length=1, max_length=64)


class Failover(_T):
    service: Ref
    fallback: Ref


class HttpService(_T):
    loadBalancer: LoadBalancer | None = None
    weighted: Weighted | None = None
    failover: Failover | None = None

    @model_validator(mode="after")
    def _one(self) -> HttpService:
        _exactly_one(self, "service")
        return self


class IpStrategy(_T):
    depth: StrictInt | None = Field(default=None, ge=0, le=64)
    excludedIPs: list[ListStr] | None = Field(default=None, max_length=64)


class IpAllowList(_T):
    sourceRange: list[ListStr] = Field(min_length=1, max_length=64)
    ipStrategy: IpStrategy | None = None


class StripPrefix(_T):
    prefixes: list[ListStr] = Field(min_length=1, max_length=16)


class Headers(_T):
    customRequestHeaders: dict[str, StrictStr] | None = None
    customResponseHeaders: dict[str, StrictStr] | None = None


class RateLimit(_T):
    average: StrictInt = Field(ge=0)
    burst: StrictInt | None = Field(default=None, ge=0)
    period: Duration | None = None


class Retry(_T):
    attempts: StrictInt = Field(ge=1, le=100)
    initialInterval: Duration | None = None


class Buffering(_T):
    maxRequestBodyBytes: StrictInt | None = Field(default=None, ge=0)
    memRequestBodyBytes: StrictInt | None = Field(default=None, ge=0)
    maxResponseBodyBytes: StrictInt | None = Field(default=None, ge=0)
    memResponseBodyBytes: StrictInt | None = Field(default=None, ge=0)


class InFlightReq(_T):
    amount: StrictInt = Field(ge=1)


class Chain(_T):
    middlewares: list[Ref] = Field(min_length=1, max_length=32)


class Middleware(_T):
    ipAllowList: IpAllowList | None = None
    stripPrefix: StripPrefix | None = None
    headers: Headers | None = None
    rateLimit: RateLimit | None = None
    retry: Retry | None = None
    chain: Chain | None = None
    buffering: Buffering | None = None
    inFlightReq: InFlightReq | None = None

    @model_validator(mode="after")
    def _one(self) -> Middleware:
        _exactly_one(self, "middleware")
        return self


class ForwardingTimeouts(_T):
    dialTimeout: Duration | None = None
    responseHeaderTimeout: Duration | None = None
    idleConnTimeout: Duration | None = None


class ServersTransport(_T):
    serverName: StrictStr | None = None
    rootCAs: list[ListStr] | None = Field(default=None, max_length=16)
    insecureSkipVerify: StrictBool | None = None
    maxIdleConnsPerHost: StrictInt | None = Field(default=None, ge=-1)
    forwardingTimeouts: ForwardingTimeouts | None = None


class HttpConfig(_T):
    routers: dict[Name, HttpRouter] | None = None
    services: dict[Name, HttpService] | None = None
    middlewares: dict[Name, Middleware] | None = None
    serversTransports: dict[Name, ServersTransport] | None = None


class TcpRouterTls(_T):
    passthrough: StrictBool | None = None


class TcpRouter(_T):
    rule: Rule
    service: Ref
    entryPoints: list[ListStr] | None = Field(default=None, max_length=16)
    priority: StrictInt | None = Field(default=None, ge=0, le=2**62)
    tls: TcpRouterTls | None = None


class TcpServer(_T):
    # Traefik's TCP server has no weight (a `weight` key freezes the provider): weights are
    # expressed with a weighted service.
    address: Annotated[StrictStr, Field(min_length=3, max_length=300)]


class TcpLoadBalancer(_T):
    servers: list[TcpServer] = Field(max_length=256)


class TcpWeighted(_T):
    services: list[WeightedRef] = Field(min_length=1, max_length=64)


class TcpService(_T):
    loadBalancer: TcpLoadBalancer | None = None
    weighted: TcpWeighted | None = None

    @model_validator(mode="after")
    def _one(self) -> TcpService:
        _exactly_one(self, "tcp service")
        return self


class TcpConfig(_T):
    routers: dict[Name, TcpRouter] | None = None
    services: dict[Name, TcpService] | None = None


class Fragment(_T):
    """What one ingress renders to: a slice of Traefik's dynamic configuration."""

    http: HttpConfig | None = None
    tcp: TcpConfig | None = None
