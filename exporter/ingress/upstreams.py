"""Upstream kinds (`servers`, `ai-proxy-multi`, a plugin's kind) and the canary split between two of them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
    field_validator,
)

from .bounds import MAX_HEADERS, MAX_INSTANCES, MAX_SERVERS
from .values import DnsLabel, Integer, Published, Strict, UrlPath, Weight, parse_upstream_url, pattern, server_url, unset

_HEADER_NAME = "^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$"
_HEADER_VALUE = "^[\\x20-\\x7e\\t]{0,4096}$"
_HEADER_NAME_RE = pattern(_HEADER_NAME)
_HEADER_VALUE_RE = pattern(_HEADER_VALUE)
_URL_DESCRIPTION = "scheme://host:port (http, https; tcp://host:port for a tcp ingress); unique within the group"


class Server(Strict):
    """One upstream server."""

    url: Annotated[str, Published(pattern=server_url(("http", "https", "tcp")), description=_URL_DESCRIPTION)] = Field(max_length=512)
    weight: Weight = 1

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parse_upstream_url(value, ("http", "https", "tcp"))
        return value


class ServersUpstream(Strict):
    """`kind: servers`: a plain list of servers."""

    kind: Literal["servers"] = "servers"
    servers: list[Server] = Field(min_length=1, max_length=MAX_SERVERS)
    # Checked by the built-in checkers, not by a plugin.
    needs_plugin: ClassVar[bool] = False

    def members(self) -> Sequence[Server]:
        """The group's members, each with its URL and weight."""
        return self.servers

    @field_validator("servers")
    @classmethod
    def _unique(cls, value: list[Server]) -> list[Server]:
        return _unique_urls(value)


def _unique_urls(servers: list[Server]) -> list[Server]:
    if len({s.url for s in servers}) != len(servers):
        raise ValueError("server urls must be unique")
    return servers


class InstanceChecks(Strict):
    """Per-instance health check overrides of an `ai-proxy-multi` instance."""

    path: UrlPath | None = None
    headers: Annotated[
        dict[str, str],
        Published(propertyNames={"pattern": _HEADER_NAME}, additionalProperties={"type": "string", "pattern": _HEADER_VALUE}),
    ] = Field(default_factory=dict, max_length=MAX_HEADERS)
    interval: float | None = Field(default=None, gt=0, le=3600)
    max_retries: Integer | None = Field(default=None, ge=1, le=100)
    max_wait_time: float | None = Field(default=None, gt=0, le=300)
    expected_status_code: Integer | None = Field(default=None, ge=100, le=599)

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, header in value.items():
            if not _HEADER_NAME_RE.fullmatch(name):
                raise ValueError(f"header name {name!r} is not an HTTP token")
            if not _HEADER_VALUE_RE.fullmatch(header):
                raise ValueError(f"header {name!r} value must be printable ASCII without CR/LF")
        return value


class Instance(Strict):
    """One named instance of an `ai-proxy-multi` upstream."""

    name: Annotated[DnsLabel, Published(description="unique within the upstream")]
    url: Annotated[str, Published(pattern=server_url(("http", "https")))] = Field(max_length=512)
    weight: Weight = 1
    checks: InstanceChecks | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parse_upstream_url(value, ("http", "https"))
        return value


class AiProxyMultiUpstream(Strict):
    """`kind: ai-proxy-multi`: named instances, each checked on its own."""

    kind: Literal["ai-proxy-multi"]
    instances: list[Instance] = Field(min_length=1, max_length=MAX_INSTANCES)
    needs_plugin: ClassVar[bool] = False

    def members(self) -> Sequence[Instance]:
        """The group's members, each with its URL and weight."""
        return self.instances

    @field_validator("instances")
    @classmethod
    def _unique(cls, value: list[Instance]) -> list[Instance]:
        names = [i.name for i in value]
        if len(set(names)) != len(names):
            raise ValueError("instance names must be unique")
        return value


PLUGIN_KIND = "^[a-z][a-z0-9-]{0,62}$"
_PLUGIN_KIND_RE = pattern(PLUGIN_KIND)
_ConfigValue = StrictStr | StrictInt | StrictFloat | StrictBool


class PluginUpstream(Strict):
    """A third-party `kind`: servers rendered as a load balancer, checked by the kind's plugin.

    `config` is the plugin's own settings (flat, at most 32 entries); that a plugin for the kind
    is installed is checked when the ingress is accepted (docs/plugins.md).
    """

    kind: Annotated[str, Published(
        pattern=PLUGIN_KIND, **{"not": {"enum": ["servers", "ai-proxy-multi"]}},
        description="a kind a checker plugin installed on the sidecar provides (docs/plugins.md); another is refused with 400",
    )]
    servers: list[Server] = Field(min_length=1, max_length=MAX_SERVERS)
    config: dict[str, _ConfigValue] = Field(default_factory=dict, max_length=32)
    # Checked by the plugin that provides `kind`.
    needs_plugin: ClassVar[bool] = True

    def members(self) -> Sequence[Server]:
        """The group's members, each with its URL and weight."""
        return self.servers

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        if not _PLUGIN_KIND_RE.fullmatch(value) or value in ("servers", "ai-proxy-multi"):
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
    Annotated[ServersUpstream, Tag("servers")]
    | Annotated[AiProxyMultiUpstream, Tag("ai-proxy-multi")]
    | Annotated[PluginUpstream, Tag("plugin")],
    Discriminator(_upstream_tag),
]


def named_instances(upstream: ServersUpstream | AiProxyMultiUpstream | PluginUpstream) -> Sequence[Instance] | None:
    """The named instances of an upstream whose members are instances (None: plain servers)."""
    return upstream.instances if isinstance(upstream, AiProxyMultiUpstream) else None


def default_kind(value: Any) -> Any:
    # `kind` defaults to `servers`.
    if isinstance(value, dict) and "kind" not in value:
        return {"kind": "servers", **value}
    return value


class Canary(Strict):
    """A weighted split: `weight` percent of traffic goes to the canary upstream.

    The canary gets its weight only while at least `min_ready` of its servers are routable
    (`all`: every one; default: any one).
    """

    weight: Integer = Field(ge=1, le=99)
    upstream: Upstream
    min_ready: Annotated[StrictInt, Field(ge=1, le=MAX_SERVERS)] | Literal["all"] | None = Field(default=None, exclude_if=unset)

    @field_validator("upstream", mode="before")
    @classmethod
    def _kind(cls, value: Any) -> Any:
        return default_kind(value)

    @field_validator("min_ready", mode="before")
    @classmethod
    def _whole_count(cls, value: Any) -> Any:
        # Integer's conversion, here outside the union so that its error names stay plain.
        return int(value) if isinstance(value, float) and value.is_integer() else value
