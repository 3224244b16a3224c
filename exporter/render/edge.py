"""What the model-serving edge fields of an ingress render to (pure, apart from reading CA files).

- the router rule: an allowlist of paths and methods (`paths`, `profile`), hostile spellings and
  blocked segments refused, the ingress's health path always allowed for GET/HEAD;
- the router priority (one place: the template and the fast path both read it);
- the servers transport's definition, when `upstream_tls`, timeouts or `keepalive: false` need
  one; forwarding timeouts are the ingress's, else the configured defaults;
- the middlewares of `allowed_client_ips`, `limits` and `retry`, in the router's order before
  the user's own.

Middlewares and transports are definitions: the renderer names each from its content and
shares it within the root (render/shared.py). `EdgePolicy.admit` checks what the configuration
bounds (timeouts, CA file directories) before anything is queued.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import TemplateError, ValidationFailed
from ..ingress import Ingress
from ..ingress.edge import PathRule, profile_blocked, profile_paths
from .ca_files import CaFiles
from .rules import host_rule

# Refused anywhere in the path of an allowlisted route. Traefik matches the path decoded and
# cleaned (dot segments resolved, `//` collapsed, and that cleaned path is what it forwards), so
# this catches what decoding reveals: a percent sign left after one decoding (double encoding),
# `;` parameters, backslashes, control characters (an encoded NUL), and, in case a path reaches
# the matcher uncleaned, empty and dot segments.
_HOSTILE = r"%|;|\\|[\x00-\x1f\x7f]|//|(^|/)\.\.?(/|$)"
_METHODS_HEAD = ("GET", "HEAD")


@dataclass(frozen=True)
class TimeoutDefaults:
    """Forwarding timeouts of ingresses that set none of their own (None: Traefik's default)."""

    dial: float | None = None
    response_header: float | None = None
    idle: float | None = None


@dataclass(frozen=True)
class EdgePolicy:
    """The configuration the edge fields render and are checked with."""

    timeouts: TimeoutDefaults = TimeoutDefaults()
    bounds: tuple[float, float] = (0.1, 3600.0)
    ca_files: CaFiles = field(default_factory=CaFiles)

    def admit(self, ingress: Ingress) -> None:
        """Raise ValidationFailed (naming the field) for a timeout out of bounds or a CA file not allowed or unreadable."""
        errors = []
        where = f"ingresses.{ingress.authority}/{ingress.id}"
        low, high = self.bounds
        for name in ("dial", "response_header", "idle"):
            value = getattr(ingress.timeouts, name) if ingress.timeouts else None
            if value is not None and not low <= value <= high:
                errors.append({"loc": f"{where}.timeouts.{name}", "msg": f"{value} is outside upstream.timeouts_bounds [{low}, {high}]"})
        ca_file = ingress.upstream_tls.ca_file if ingress.upstream_tls else None
        if ca_file is not None:
            problem = self.ca_files.problem(ca_file)
            if problem is not None:
                errors.append({"loc": f"{where}.upstream_tls.ca_file", "msg": problem})
        if errors:
            raise ValidationFailed(f"{errors[0]['loc']}: {errors[0]['msg']}", {"errors": errors})

    # ----- the router

    def rule(self, ingress: Ingress) -> str:
        """The router rule: hosts, then the allowlist (or `path_prefix`), minus what is refused."""
        hosts = host_rule(ingress.hosts)
        allowlist = _allowlist(ingress)
        blocked = _blocked(ingress)
        if allowlist is None:
            path = f" && PathPrefix(`{ingress.path_prefix}`)" if ingress.path_prefix != "/" else ""
            if not blocked:
                return hosts + path
            return f"{hosts}{path} && !PathRegexp(`{_deny(blocked)}`)"
        allowed = f"({' || '.join(_alternative(p) for p in allowlist)}) && !PathRegexp(`{_deny(blocked)}`)"
        health = f"Path(`{ingress.health_check.path}`) && {_methods(_METHODS_HEAD)}"
        return f"{hosts} && (({allowed}) || ({health}))"

    def priority(self, ingress: Ingress) -> int:
        """100 plus the length of the longest path the router names (its `path_prefix` without an allowlist)."""
        allowlist = _allowlist(ingress)
        if allowlist is None:
            return 100 + len(ingress.path_prefix)
        return 100 + max(len(p.prefix or p.exact or p.regex or "") for p in allowlist)

    # ----- the transport

    def transport(self, ingress: Ingress) -> dict[str, Any] | None:
        """The servers transport's definition (None when the ingress needs none)."""
        out: dict[str, Any] = {}
        tls = ingress.upstream_tls
        if tls is not None:
            if tls.server_name:
                out["serverName"] = tls.server_name
            ca = tls.ca_pem if tls.ca_pem is not None else self._ca(tls.ca_file, ingress)
            if ca:
                out["rootCAs"] = [ca]
            out["insecureSkipVerify"] = tls.insecure_skip_verify
        if ingress.keepalive is False:
            out["maxIdleConnsPerHost"] = -1
        timeouts = self._timeouts(ingress)
        if timeouts:
            out["forwardingTimeouts"] = timeouts
        return out or None

    def _ca(self, path: str | None, ingress: Ingress) -> str | None:
        if path is None:
            return None
        content = self.ca_files.content(path)
        if content is None:
            raise TemplateError(
                f"upstream_tls.ca_file of {ingress.authority}/{ingress.id}: {self.ca_files.problem(path)}", {"ca_file": path}
            )
        return content

    def _timeouts(self, ingress: Ingress) -> dict[str, str]:
        own = ingress.timeouts
        out = {}
        for ours, theirs in (("dial", "dialTimeout"), ("response_header", "responseHeaderTimeout"), ("idle", "idleConnTimeout")):
            value = getattr(own, ours) if own is not None else None
            value = value if value is not None else getattr(self.timeouts, ours)
            if value is not None:
                out[theirs] = duration(value)
        return out

    # ----- middlewares

    @staticmethod
    def middlewares(ingress: Ingress) -> list[tuple[str, dict[str, Any]]]:
        """The middlewares `allowed_client_ips`, `limits` and `retry` render to, as (kind, definition), in the router's order."""
        out: list[tuple[str, dict[str, Any]]] = []
        if ingress.protocol == "http" and ingress.allowed_client_ips:
            allow: dict[str, Any] = {"sourceRange": list(ingress.allowed_client_ips)}
            strategy = ingress.allowed_client_ips_strategy
            if strategy is not None:
                allow["ipStrategy"] = {"depth": strategy.depth, **({"excludedIPs": strategy.excluded_ips} if strategy.excluded_ips else {})}
            out.append(("allow", {"ipAllowList": allow}))
        limits = ingress.limits
        if limits is not None and limits.rate is not None:
            rate: dict[str, Any] = {"average": limits.rate.average}
            if limits.rate.burst is not None:
                rate["burst"] = limits.rate.burst
            if limits.rate.period is not None:
                rate["period"] = duration(limits.rate.period)
            out.append(("rate", {"rateLimit": rate}))
        if limits is not None and limits.max_in_flight is not None:
            out.append(("inflight", {"inFlightReq": {"amount": limits.max_in_flight}}))
        if limits is not None and limits.max_body_bytes is not None:
            out.append(("body", {"buffering": {"maxRequestBodyBytes": limits.max_body_bytes}}))
        if ingress.retry is not None:
            retry: dict[str, Any] = {"attempts": ingress.retry.attempts}
            if ingress.retry.initial_interval is not None:
                retry["initialInterval"] = duration(ingress.retry.initial_interval)
            out.append(("retry", {"retry": retry}))
        return out


@functools.lru_cache(maxsize=256)
def duration(seconds: float) -> str:
    """A Traefik duration: whole seconds as `5s`, anything else in milliseconds (`250ms`, at least `1ms`)."""
    if float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{max(1, round(seconds * 1000))}ms"


def _allowlist(ingress: Ingress) -> list[PathRule] | None:
    if ingress.paths is None and ingress.profile is None:
        return None
    return [*(profile_paths(ingress.profile) if ingress.profile else []), *(ingress.paths or [])]


def _blocked(ingress: Ingress) -> list[str]:
    return list(dict.fromkeys([*profile_blocked(ingress.profile), *(ingress.blocked_segments or [])]))


def _deny(blocked: Sequence[str]) -> str:
    if not blocked:
        return _HOSTILE
    segments = "|".join(s.replace(".", "\\.") for s in blocked)
    # A blocked segment matches in any case, with trailing dots (`metrics.`) or before a `;`.
    return f"(?i){_HOSTILE}|(^|/)({segments})\\.*(/|$)"


def _methods(methods: Sequence[str]) -> str:
    if len(methods) == 1:
        return f"Method(`{methods[0]}`)"
    return "(" + " || ".join(f"Method(`{m}`)" for m in methods) + ")"


def _alternative(path: PathRule) -> str:
    if path.prefix is not None:
        matcher = f"PathPrefix(`{path.prefix}`)"
    elif path.exact is not None:
        matcher = f"Path(`{path.exact}`)"
    else:
        matcher = f"PathRegexp(`{path.regex}`)"
    return matcher if path.methods is None else f"({matcher} && {_methods(path.methods)})"
