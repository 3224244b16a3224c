"""The model-serving edge of an ingress: timeouts, keep-alive, path and method allowlists, limits, retry.

All optional: an ingress without them renders exactly as before. What each field writes is in
docs/key-layout.md, what the allowlists stop (and what they do not) in docs/security.md.
"""

from __future__ import annotations

import functools
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, StrictFloat, StrictInt, StrictStr, model_validator

from .values import Integer, Published, Strict, UrlPath, pattern

MAX_PATHS = 32
MAX_BLOCKED_SEGMENTS = 32
MAX_REGEX_BYTES = 256

Method = Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"]
Seconds = Annotated[StrictInt | StrictFloat, Field(gt=0, le=86_400, allow_inf_nan=False)]

# A path regex is written into Traefik's rule as PathRegexp(`...`) and compiled by Go's RE2:
# only the syntax RE2 and Python share, and nothing that could end the rule literal (a
# backtick) or carry a quote, a space or a control character.
# The published form of a path regex, a grammar that always compiles in RE2 and Python alike: after
# the anchor, literals, the escapes both share and character classes, each optionally quantified by
# ? * +; groups three deep; alternation. What the validator accepts beyond it (deeper groups,
# {m,n}) is named in the description.
_ESCAPE = r"\\[.dwsDWS/+?*()\[\]{}|^$\\-]"
# A class holds ranges of the three common kinds, single characters and escapes (`-` only in a range).
_CLASS = rf"\[\^?(a-z|A-Z|0-9|a-f|A-F|[A-Za-z0-9._~/:=@!&,^$|?*+(){{}}]|{_ESCAPE})+\]"
_ATOM = rf"(([A-Za-z0-9._~/:=@!&,-]|{_ESCAPE}|{_CLASS})[?*+]?|[$^])"
_GROUP = rf"\((\?:)?({_ATOM}|\|)*\)[?*+]?"
for _ in range(2):  # groups three deep
    _GROUP = rf"\((\?:)?({_ATOM}|{_GROUP}|\|)*\)[?*+]?"
_REGEX = rf"^\^/({_ATOM}|{_GROUP}|\|)*$"
_REGEX_CHARS = pattern("^[A-Za-z0-9._~/^$()\\[\\]|?*+{},\\\\:=@!&-]+$")
# Every regex the validator accepts has this form (what a stored ingress may hold).
REGEX_ACCEPTED = "^\\^/[A-Za-z0-9._~/^$()\\[\\]|?*+{},\\\\:=@!&-]*$"
_REGEX_ESCAPES = frozenset(".dwsDWS-/+?*()[]{}|^$\\")
_SEGMENT = "^[A-Za-z0-9._~-]{1,64}$"
_SEGMENT_RE = pattern(_SEGMENT)


def _regex(value: str) -> str:
    if len(value.encode()) > MAX_REGEX_BYTES:
        raise ValueError(f"must be at most {MAX_REGEX_BYTES} bytes")
    if not _REGEX_CHARS.fullmatch(value):
        raise ValueError("may contain only [A-Za-z0-9._~/^$()[]|?*+{},\\:=@!&-]: no backticks, quotes, spaces or control characters")
    if not value.startswith("^/"):
        raise ValueError("must be anchored at the start of the path: begin with '^/'")
    # Escaped characters stand for themselves: `\(?` is an optional parenthesis, not a group.
    if "(?" in re.sub(r"\\.", "e", value).replace("(?:", ""):
        raise ValueError("must not use flags, lookarounds or named groups (only (?:...) groups)")
    escaped = re.findall(r"\\(.)", value)
    if any(c not in _REGEX_ESCAPES for c in escaped):
        raise ValueError("may escape only . d w s D W S - / + ? * ( ) [ ] { } | ^ $ \\ (the escapes RE2 and Python share)")
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"does not compile: {exc.msg}") from None
    return value


def _segment(value: str) -> str:
    if not _SEGMENT_RE.fullmatch(value) or value.strip(".") == "":
        raise ValueError("must be one path segment of [A-Za-z0-9._~-] (at most 64 characters, not only dots)")
    return value.lower()


Regex = Annotated[StrictStr, AfterValidator(_regex), Published(
    pattern=_REGEX, maxLength=MAX_REGEX_BYTES,
    description="anchored (^/...), in the syntax RE2 and Python share; the pattern is a part of it that always compiles,"
    " and also accepted are deeper groups and {m,n} (what compiles, with no flags, lookarounds or named groups,"
    " escaping only . d w s D W S - / + ? * ( ) [ ] { } | ^ $ \\)",
)]
Segment = Annotated[StrictStr, AfterValidator(_segment), Published(pattern=_SEGMENT, **{"not": {"pattern": "^\\.+$"}})]


class Timeouts(Strict):
    """Forwarding timeouts towards the upstream, in seconds (within `upstream.timeouts_bounds`)."""

    dial: Seconds | None = None
    response_header: Seconds | None = None
    idle: Seconds | None = None


class PathRule(Strict):
    """One allowed path: exactly one of `prefix`, `exact`, `regex`; `methods` (default: any) allowed on it."""

    prefix: UrlPath | None = None
    exact: UrlPath | None = None
    regex: Regex | None = None
    methods: list[Method] | None = Field(default=None, min_length=1, max_length=9)

    @model_validator(mode="after")
    def _one(self) -> PathRule:
        given = [n for n in ("prefix", "exact", "regex") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError("needs exactly one of prefix, exact, regex")
        if self.methods is not None and len(set(self.methods)) != len(self.methods):
            raise ValueError("methods: must be unique")
        return self


class Rate(Strict):
    """Traefik's rateLimit: `average` requests per `period` seconds (default 1), bursts of `burst`."""

    average: Integer = Field(ge=1, le=1_000_000)
    burst: Integer | None = Field(default=None, ge=1, le=1_000_000)
    period: Seconds | None = None


class Limits(Strict):
    """Request limits: 413 past `max_body_bytes`, 429 past `max_in_flight` concurrent requests or the `rate`."""

    max_body_bytes: Integer | None = Field(default=None, ge=1, le=2**40)
    max_in_flight: Integer | None = Field(default=None, ge=1, le=1_000_000)
    rate: Rate | None = None


class Retry(Strict):
    """Traefik's retry: up to `attempts` more tries of a request that never reached a server."""

    attempts: Integer = Field(ge=1, le=10)
    initial_interval: Annotated[StrictInt | StrictFloat, Field(ge=0, le=60, allow_inf_nan=False)] | None = None


Profile = Literal["openai", "sglang", "kserve-v2"]

_BLOCKED = ("admin", "debug", "docs", "instances", "metrics", "openapi.json")
_GET_HEAD: list[Any] = ["GET", "HEAD"]
_OPENAI = [
    {"exact": "/health", "methods": _GET_HEAD},
    {"regex": "^/v1/models(/[^/]+)?$", "methods": _GET_HEAD},
    {"exact": "/v1/chat/completions", "methods": ["POST"]},
    {"exact": "/v1/completions", "methods": ["POST"]},
    {"exact": "/v1/embeddings", "methods": ["POST"]},
    {"exact": "/v1/responses", "methods": ["POST"]},
]
_PROFILES: dict[str, list[dict[str, Any]]] = {
    "openai": _OPENAI,
    "sglang": [*_OPENAI, {"exact": "/generate", "methods": ["POST"]}, {"exact": "/server_info", "methods": ["GET"]}],
    "kserve-v2": [{"regex": "^/v2/models(/[^/]+(/(ready|config|stats|infer))?)?$", "methods": ["GET", "HEAD", "POST"]}],
}


@functools.cache
def profile_paths(profile: str) -> tuple[PathRule, ...]:
    """The allowlist a named profile expands to (docs/ingress.md spells each out); built once per profile."""
    return tuple(PathRule.model_validate(p) for p in _PROFILES[profile])


def profile_blocked(profile: str | None) -> tuple[str, ...]:
    """The segments a profile blocks (none without one)."""
    return _BLOCKED if profile is not None else ()

