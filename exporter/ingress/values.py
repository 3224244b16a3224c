"""Validated values: names, hosts, paths, addresses and URLs that can reach a Traefik rule or an etcd key.

Each can inject neither rule syntax (backticks, quotes, `||`, parentheses) nor a key segment
(`/`); the models of this package are built from these.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationInfo,
    WithJsonSchema,
)
from pydantic_core import CoreSchema


class Published:
    """JSON Schema keywords of a value whose check is Python code: what the published contract
    (docs/openapi.yaml, generated from these models) says of it. A `pattern` is the one the
    validator matches with `re.fullmatch`, so the schema and the check cannot drift apart."""

    def __init__(self, **keywords: Any) -> None:
        self.keywords = keywords

    def __get_pydantic_json_schema__(self, core: CoreSchema, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        schema: dict[str, Any] = handler(core)
        schema.update(self.keywords)
        return schema


def pattern(expression: str) -> re.Pattern[str]:
    """A published pattern (ECMA-262 and Python alike, anchored `^...$`) compiled for `fullmatch`:
    `$` alone would also match before a trailing newline, `fullmatch` never does."""
    return re.compile(expression)


LABEL = "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
DNS_LABEL = f"^{LABEL}$"
HOST_NAME = rf"^(\*\.{LABEL}(\.{LABEL})+|{LABEL}(\.{LABEL})*)$"
URL_PATH = "^/[A-Za-z0-9._~%+=:@/-]{0,255}$"
ENTRYPOINT = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
_OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4 = rf"{_OCTET}(\.{_OCTET}){{3}}"
_H16 = "[0-9a-fA-F]{1,4}"
# Every IPv6 text form but the ones ending in a dotted IPv4 (accepted, not published).
IPV6 = "(" + "|".join((
    rf"({_H16}:){{7}}{_H16}",
    *(rf"({_H16}:){{1,{n}}}(:{_H16}){{1,{7 - n}}}" for n in range(1, 7)),
    rf"({_H16}:){{1,7}}:",
    rf":(:{_H16}){{1,7}}",
    "::",
)) + ")"
PORT = "([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
_HOST_IN_URL = rf"({IPV4}|{LABEL}(\.{LABEL})*|\[{IPV6}\])"


def server_url(schemes: tuple[str, ...]) -> str:
    """The published pattern of a server URL with one of `schemes`: scheme://host:port, an optional path."""
    return rf"^({'|'.join(schemes)})://{_HOST_IN_URL}:{PORT}(/[A-Za-z0-9._~%+=:@/-]{{0,255}})?$"


_DNS_LABEL_RE = pattern(DNS_LABEL)
_HOST_RE = pattern(HOST_NAME)
_PATH_RE = pattern(URL_PATH)
_ENTRYPOINT_RE = pattern(ENTRYPOINT)
_URL_RE = pattern(server_url(("http", "https", "tcp")))


def _dns_label(value: str) -> str:
    if not _DNS_LABEL_RE.fullmatch(value):
        raise ValueError("must be a DNS label: 1-63 of [a-z0-9-], lowercase, not starting or ending with '-'")
    if value.isdigit():
        raise ValueError("must not be all digits (Traefik decodes a numeric name as a list index)")
    return value


def _hostname(value: str) -> str:
    if len(value) > 253:
        raise ValueError("must be at most 253 characters")
    if not _HOST_RE.fullmatch(value):
        if value.startswith("*.") and _HOST_RE.fullmatch(value[2:]):
            raise ValueError("a wildcard host needs at least two labels after '*.'")
        raise ValueError("must be an RFC 1123 host name: lowercase labels of [a-z0-9-] separated by '.'")
    return value


def _path(value: str) -> str:
    if not _PATH_RE.fullmatch(value):
        raise ValueError(
            "must start with '/' and contain only [A-Za-z0-9._~%+=:@/-] (at most 256 characters)"
        )
    return value


def validate_entrypoint(value: str) -> str:
    """An entrypoint name (also used for the config's default_entrypoints)."""
    if not _ENTRYPOINT_RE.fullmatch(value):
        raise ValueError("must be an entrypoint name of [A-Za-z0-9_-] (at most 64 characters)")
    return value


def _cidr(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        raise ValueError("must be an IP address or CIDR range such as 10.0.0.0/8") from None


def _whole(value: Any) -> Any:
    # JSON Schema's `integer` is any number without a fraction: 3.0 is the integer 3.
    return int(value) if isinstance(value, float) and value.is_integer() else value


# An integer as the published contract means it (3 or 3.0, never "3" or 3.5).
Integer = Annotated[int, BeforeValidator(_whole)]
DnsLabel = Annotated[str, AfterValidator(_dns_label), Published(pattern=DNS_LABEL, **{"not": {"pattern": "^[0-9]+$"}})]
# A server's share of its group: an integer, or a ratio such as Backend.AI's traffic_ratio (0.7);
# 0 sends it no traffic. Rendered as Traefik's integer weights (render/renderer.py).
Weight = Annotated[
    StrictInt | StrictFloat, Field(ge=0, le=1_000_000, allow_inf_nan=False),
    WithJsonSchema({"type": "number", "minimum": 0, "maximum": 1_000_000, "description": "an integer, or a ratio such as 0.7; 0: none"}),
]


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
Authority = Annotated[
    StrictStr, AfterValidator(_authority),
    Published(pattern="^[^/\\x00-\\x1f\\x7f]+$", maxLength=253,
              description="free text (Backend.AI's authority) without '/' or control characters, at most 253 bytes in UTF-8"),
]
HostName = Annotated[str, AfterValidator(_hostname), Published(pattern=HOST_NAME, maxLength=253)]
UrlPath = Annotated[str, AfterValidator(_path), Published(pattern=URL_PATH)]
EntryPoint = Annotated[str, AfterValidator(validate_entrypoint), Published(pattern=ENTRYPOINT)]
_PREFIX4 = "(3[0-2]|[12]?[0-9])"
_PREFIX6 = "(12[0-8]|1[01][0-9]|[1-9]?[0-9])"
Cidr = Annotated[
    str, AfterValidator(_cidr),
    Published(pattern=f"^({IPV4}(/{_PREFIX4})?|{IPV6}(/{_PREFIX6})?)$",
              description="an IP address or CIDR range such as 10.0.0.0/8 (host bits are cleared)"),
]


# Distinct values kept for sharing (a bound: the values come from pushes).
_MAX_SHARED = 4096
_SHARED: dict[tuple[type, str], Any] = {}
_FIELDS_GIVEN: dict[frozenset[str], set[str]] = {}


class Strict(BaseModel):
    """The base of every ingress model: unknown fields rejected, values immutable, no type coercion."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    def model_post_init(self, context: Any, /) -> None:
        """Share the set of the names of the fields given: nearly every instance gives one of a
        few, and a set of its own per instance (216-728 bytes) is 14 MB at 10,000 ingresses.
        A frozen model never changes its set; a copy gets one of its own."""
        given = self.__pydantic_fields_set__
        shared = _FIELDS_GIVEN.get(names := frozenset(given))
        if shared is None:
            if len(_FIELDS_GIVEN) >= _MAX_SHARED:
                return
            _FIELDS_GIVEN[names] = shared = given
        object.__setattr__(self, "__pydantic_fields_set__", shared)

S = TypeVar("S", bound=Strict)


def shared(value: S) -> S:
    """One instance per distinct value of a frozen model: most ingresses carry one of a few health
    checks, timeouts, limits or TLS settings, and 10,000 copies of each are megabytes. Keyed by
    the exact JSON (`1` and `1.0` compare equal, but a record must keep its own bytes)."""
    key = (type(value), value.model_dump_json())
    found: S | None = _SHARED.get(key)
    if found is not None:
        return found
    if len(_SHARED) < _MAX_SHARED:
        _SHARED[key] = value
    return value


# The validation context of a record read back from etcd: combinations an earlier version
# accepted and that are now refused (they had no effect in Traefik) still load, and render as
# they did, so an upgrade neither drops nor rewrites a stored ingress; the next push must leave them out.
STORED: dict[str, Any] = {"stored": True}


def admitting(info: ValidationInfo) -> bool:
    """True when validating new input (a push or a file), False for a record read back from etcd."""
    return not (isinstance(info.context, dict) and info.context.get("stored"))


def unset(value: Any) -> bool:
    """A field's serializer skips it when this says so (`Field(exclude_if=unset)`): fields added after
    records were first stored stay out of the canonical JSON while unset, so a stored record keeps its
    exact bytes. Pydantic checks it per field while it serializes, with no dict built and filtered."""
    return value is None


_SIMPLE_URL_RE = re.compile(
    r"^(?P<scheme>[a-z]+)://(?P<host>(?:\d{1,3}\.){3}\d{1,3}|[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?):(?P<port>\d{1,5})/?\Z"
)


def parse_upstream_url(value: str, schemes: tuple[str, ...]) -> tuple[str, str, int]:
    """Split a server URL into (scheme, host, port); raise ValueError naming what is wrong."""
    simple = _SIMPLE_URL_RE.match(value)
    if simple and simple["scheme"] in schemes and simple["port"][0] != "0" and int(simple["port"]) < 65536:
        # The common case (scheme://ipv4-or-name:port), checked without urlsplit.
        host = simple["host"]
        if host.count(".") == 3 and host.replace(".", "").isdigit():
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
    if not _URL_RE.fullmatch(value):
        raise ValueError("must be scheme://host:port (a lowercase host name, an IPv4 address or [an IPv6 address]), an optional path")
    return parts.scheme, host, port
