"""The checker plugin hook: an upstream group's `kind` declares its own checkers.

A kind is an object with `kind` (the upstream `kind` it handles) and `targets(group,
resource, defaults)`, returning CheckerTargets. A target may carry its own `probe`
coroutine. Built-in kinds: `servers` and `ai-proxy-multi`; third-party kinds are found in
the entry-point group `traefik_etcd_exporter.checkers` (see docs/plugins.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

from loguru import logger

from ..ingress import HealthCheck, Ingress
from .state import NodeHealth, Outcome

ENTRY_POINT_GROUP = "traefik_etcd_exporter.checkers"


@dataclass(frozen=True, slots=True)
class CheckConfig:
    """How to probe a target's nodes (Backend.AI ModelHealthCheck meaning)."""

    type: Literal["http", "tcp"] = "http"
    path: str = "/health"
    method: str = "GET"
    headers: tuple[tuple[str, str], ...] = ()
    interval: float = 10.0
    timeout: float = 15.0
    max_retries: int = 10
    expected_status: int = 200
    initial_delay: float = 60.0


@dataclass(frozen=True, slots=True)
class Node:
    """One probed endpoint; `url` is its identity (it is what rendering leaves out when ejected).

    `ip` (the URL's host) and `port` are read from the URL once, not on every probe.
    """

    url: str
    ip: str = field(init=False, compare=False, repr=False)
    port: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        object.__setattr__(self, "ip", parts.hostname or "")
        object.__setattr__(self, "port", parts.port or (443 if parts.scheme == "https" else 80))


Probe = Callable[[Node, CheckConfig], Awaitable[Outcome]]


@dataclass(frozen=True)
class CheckerTarget:
    """One checker: named nodes probed with one config; `meta` is reported verbatim."""

    name: str
    nodes: tuple[Node, ...]
    check: CheckConfig
    plugin: str | None = None
    meta: dict[str, Any] | None = None
    probe: Probe | None = field(default=None, compare=False)


class CheckerKind(Protocol):
    """What a plugin provides for one upstream kind."""

    kind: str

    def targets(self, group: Any, resource: str, defaults: HealthCheck, protocol: str = "http") -> list[CheckerTarget]:
        """The checkers of one upstream group; `resource` is `<authority>/<id>/<group>` (group: primary, canary)."""
        ...


def targets_of(kinds: Mapping[str, CheckerKind], ingress: Ingress) -> list[CheckerTarget]:
    """The checker targets an ingress declares through the kinds of its upstream groups."""
    out: list[CheckerTarget] = []
    groups: list[tuple[str, Any]] = [("primary", ingress.upstream)]
    if ingress.canary is not None:
        groups.append(("canary", ingress.canary.upstream))
    for label, group in groups:
        kind = kinds.get(group.kind)
        if kind is not None:
            resource = f"{ingress.authority}/{ingress.id}/{label}"
            out.extend(kind.targets(group, resource, ingress.health_check, ingress.protocol))
    return out


# Edge values of Backend.AI's unbounded ModelHealthCheck (docs/ingress.md): probes no more often
# than every 0.1 s, time out after at least 0.1 s, and eject after at least one failure.
MIN_INTERVAL = MIN_TIMEOUT = 0.1


def default_check(hc: HealthCheck, protocol: str) -> CheckConfig:
    """The ingress's health_check block as a CheckConfig (edge values given their documented meaning)."""
    return CheckConfig(
        type="tcp" if protocol == "tcp" else "http",
        path=hc.path,
        interval=max(hc.interval, MIN_INTERVAL),
        timeout=max(hc.max_wait_time, MIN_TIMEOUT),
        max_retries=max(hc.max_retries, 1),
        expected_status=hc.expected_status_code,
        initial_delay=hc.initial_delay,
    )


def checker_entry(
    name: str, target: CheckerTarget, nodes: Mapping[str, NodeHealth], passive: Callable[[str], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """One checker in the APISIX `/v1/healthcheck` shape; a plugin's entries add `plugin` and `meta`.

    With passive health on, `passive(url)` adds `counter.passive_failure` and, while the
    node is passively ejected, `passive_ejection`.
    """
    entry: dict[str, Any] = {
        "name": name,
        "type": target.check.type,
        "nodes": [
            _node_entry(node, nodes[node.url].state.value, nodes[node.url].counter(), passive)
            for node in target.nodes
            if node.url in nodes
        ],
    }
    if target.plugin is not None:
        entry["plugin"] = target.plugin
        entry["meta"] = target.meta if target.meta is not None else {}
    return entry


def passive_entry(name: str, urls: list[str], passive: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """The entry of servers only passive health watches (`type: passive`): healthy unless passively ejected."""
    nodes = []
    for url in urls:
        extra = passive(url)
        status = "unhealthy" if "passive_ejection" in extra else "healthy"
        nodes.append(_node_entry(Node(url), status, NodeHealth(added_at=0).counter(), passive))
    return {"name": name, "type": "passive", "nodes": nodes}


def _node_entry(node: Node, status: str, counter: dict[str, int], passive: Callable[[str], dict[str, Any]] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"ip": node.ip, "port": node.port, "hostname": node.ip, "status": status, "counter": counter}
    if passive is not None:
        extra = passive(node.url)
        counter["passive_failure"] = extra.pop("passive_failure")
        out.update(extra)
    return out


def load_kinds(builtin: list[CheckerKind]) -> dict[str, CheckerKind]:
    """Built-in kinds plus those registered under the entry-point group (a bad plugin is logged, skipped)."""
    kinds = {k.kind: k for k in builtin}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            plugin = ep.load()
            plugin = plugin() if isinstance(plugin, type) else plugin
            if plugin.kind in kinds:
                logger.error("checker plugin {} redefines kind {!r}: ignored", ep.value, plugin.kind)
                continue
            kinds[plugin.kind] = plugin
            logger.info("checker plugin {} provides kind {!r}", ep.value, plugin.kind)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop the daemon
            logger.error("checker plugin {} failed to load: {}", ep.value, exc)
    return kinds
