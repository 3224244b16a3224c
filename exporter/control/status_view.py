"""What the status page and `status` show: the daemon's state gathered into plain values (no HTML here).

Every value that came from a push (authorities, ids, hosts, URLs, header values) is returned
as text, for templates that escape it and scripts that set `textContent`. Health-check headers
are shown redacted: their values may be credentials.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from ..errors import TemplateError
from ..health.engine import HealthEngine
from ..health.passive import members_of
from ..health.state import NodeHealth
from ..ingress import Ingress
from ..keys import IngressRef
from ..plan.format import redact
from ..store.records import Record
from ..traefik.observer import TraefikObserver
from ..traefik.serving import Serving
from .events import EventRing

# Rows per page of the ingress table (the page stays fast at 10,000 ingresses).
PAGE_SIZE = 50


class Reconciling(Protocol):
    """What the view reads of the reconciler."""

    @property
    def records(self) -> dict[IngressRef, Record]: ...

    def preview_one(self, ref: IngressRef) -> str: ...

    def rendered_keys(self, ref: IngressRef) -> dict[str, str]: ...


@dataclass(frozen=True)
class ServerRow:
    """One server of an ingress with its health verdict."""

    url: str
    group: str  # primary or canary
    weight: float
    status: str  # healthy, unhealthy, mostly_healthy, mostly_unhealthy, unchecked
    routed: bool
    counters: dict[str, int] = field(default_factory=dict)
    ejected_until: str | None = None
    # The last active probe: when (RFC 3339, UTC) and its outcome (success, http_failure, ...).
    last_check: str | None = None
    last_outcome: str | None = None
    # The sidecar probing it (health.sharding on).
    prober: str | None = None


@dataclass(frozen=True)
class IngressRow:
    """One row of the ingress table."""

    authority: str
    id: str
    revision: int
    hosts: list[str]
    served: bool | None
    pending: bool
    committed_revision: int
    canary_weight: int | None
    servers: list[ServerRow]
    errors: list[str]

    @property
    def healthy(self) -> bool:
        """Served (or unknown) and every server in rotation."""
        return self.served is not False and not self.pending and all(s.routed for s in self.servers) and not self.errors

    def matches(self, query: str) -> bool:
        """True when `query` is part of the id, the authority, a host or a server URL (case-insensitive)."""
        q = query.lower()
        return any(q in text.lower() for text in (self.id, self.authority, *self.hosts, *(s.url for s in self.servers)))

    def to_json(self) -> dict[str, Any]:
        """The row as JSON (what the page's live updates read)."""
        return {
            "authority": self.authority, "id": self.id, "revision": self.revision, "hosts": self.hosts,
            "served": self.served, "pending": self.pending, "committed_revision": self.committed_revision,
            "canary_weight": self.canary_weight, "healthy": self.healthy, "errors": self.errors,
            "servers": [
                {"url": s.url, "group": s.group, "weight": s.weight, "status": s.status, "routed": s.routed,
                 "counters": s.counters, "ejected_until": s.ejected_until, "last_check": s.last_check,
                 "last_outcome": s.last_outcome}
                for s in self.servers
            ],
        }


@dataclass(frozen=True)
class Page:
    """One page of the ingress table."""

    rows: list[IngressRow]
    total: int
    matching: int
    page: int
    pages: int


class StatusView:
    """Gathers the daemon's state for the status page, `/ui/state.json` and the `status` command."""

    def __init__(
        self, *, version: str, reconciler: Reconciling, serving: Serving, observer: TraefikObserver | None,
        health: HealthEngine, events: EventRing, readiness: Callable[[], list[str]], role: Callable[[], dict[str, Any]],
        etcd_reachable: Callable[[], bool | None], discovery: Callable[[], bool | None],
    ) -> None:
        self.version = version
        self._reconciler = reconciler
        self._serving = serving
        self._observer = observer
        self._health = health
        self.events = events
        self._readiness = readiness
        self._role = role
        self._etcd_reachable = etcd_reachable
        self._discovery = discovery

    # ----- sections

    def overview(self, rows: Iterable[IngressRow] | None = None) -> dict[str, Any]:
        """Version, role, etcd, discovery, readiness and the counts."""
        rows = list(rows) if rows is not None else self.rows()
        reasons = self._readiness()
        servers = [s for r in rows for s in r.servers]
        return {
            "version": self.version, **self._role(), "etcd_reachable": self._etcd_reachable(),
            "discovery_registered": self._discovery(), "ready": not reasons, "reasons": reasons,
            "ingresses": len(rows), "served": sum(1 for r in rows if r.served),
            "pending": sum(1 for r in rows if r.pending), "refused": sum(1 for r in rows if r.errors),
            "servers_routable": sum(1 for s in servers if s.routed), "servers_ejected": sum(1 for s in servers if not s.routed),
        }

    def roots(self) -> list[dict[str, Any]]:
        """Convergence per root, with what to do about each blocking key."""
        if self._observer is None:
            return []
        out = []
        for view in self._observer.roots():
            root = view.to_json()
            root["advice"] = [f"{key}: not written by this exporter and Traefik cannot decode it; delete it "
                              f"(etcdctl del {key}) or fix its value" for key in view.blocking_keys]
            out.append(root)
        return out

    def rows(self) -> list[IngressRow]:
        """Every stored ingress, by authority and id."""
        records = self._reconciler.records
        return [self._row(records[ref]) for ref in sorted(records)]

    def page(self, query: str = "", only_bad: bool = False, page: int = 1, rows: list[IngressRow] | None = None) -> Page:
        """The rows matching `query` (and only those not served or with a server out of rotation), one page of them."""
        every = rows if rows is not None else self.rows()
        chosen = [r for r in every if (not query or r.matches(query)) and (not only_bad or not r.healthy)]
        pages = max(1, -(-len(chosen) // PAGE_SIZE))
        page = min(max(1, page), pages)
        return Page(chosen[(page - 1) * PAGE_SIZE : page * PAGE_SIZE], len(every), len(chosen), page, pages)

    def ingress(self, ref: IngressRef) -> dict[str, Any] | None:
        """One ingress: its row, its record (headers redacted), its rendered keys, the live diff and its events."""
        record = self._reconciler.records.get(ref)
        if record is None:
            return None
        try:
            # Rendered values pass through the diff's redaction (private keys, check headers).
            keys = {k: redact(v) for k, v in self._reconciler.rendered_keys(ref).items()}
            diff = self._reconciler.preview_one(ref)
        except TemplateError as exc:
            keys, diff = {}, f"not rendered: {exc.title}"
        return {"row": self._row(record), "record": redacted(record.ingress), "keys": keys, "diff": diff,
                "events": self.events.recent(50, ref)}

    # ----- rows

    def _row(self, record: Record) -> IngressRow:
        ref, ingress = record.key, record.ingress
        status = self._serving.status(record)
        ejected = self._health.ejected(ref, ingress)
        checked = self._checked(ref)
        servers = [
            self._server(url, group, weight, ejected, checked, self._health.node(ref, url))
            for group, members in members_of(ingress)
            for url, weight in members
        ]
        canary = None
        if ingress.canary is not None:
            # As currently weighted: no canary server routable means its share goes to the primary.
            canary = ingress.canary.weight if any(s.routed for s in servers if s.group == "canary") else 0
        return IngressRow(
            authority=ref.authority, id=ref.id, revision=record.revision, hosts=list(ingress.hosts),
            served=status["served"], pending=bool(status.get("pending")), committed_revision=status["committed_revision"],
            canary_weight=canary, servers=servers, errors=status["errors"],
        )

    def _checked(self, ref: IngressRef) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for entry in self._health.checkers(ref):
            for node in entry["nodes"]:
                out[f"{node['ip']}:{node['port']}"] = node
        return out

    @staticmethod
    def _server(
        url: str, group: str, weight: float, ejected: frozenset[str], checked: dict[str, dict[str, Any]], probed: NodeHealth | None,
    ) -> ServerRow:
        node = checked.get(url.split("://", 1)[-1].split("/", 1)[0]) if checked else None
        until = None
        if node is not None and isinstance(ejection := node.get("passive_ejection"), dict) and ejection.get("until"):
            until = _stamp(float(ejection["until"]))
        return ServerRow(
            url=url, group=group, weight=weight, status=node["status"] if node else "unchecked", routed=url not in ejected,
            counters=dict(node["counter"]) if node else {}, ejected_until=until,
            last_check=_stamp(probed.checked_at) if probed is not None and probed.checked_at else None,
            last_outcome=probed.last_outcome if probed is not None and probed.checked_at else None,
            prober=node.get("prober") if node else None,
        )


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def redacted(ingress: Ingress) -> dict[str, Any]:
    """The ingress as pushed, with every health-check header value replaced (they may carry credentials)."""
    data = ingress.model_dump(mode="json")

    def scrub(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (dict.fromkeys(v, "<redacted>") if k == "headers" and isinstance(v, dict) else scrub(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [scrub(v) for v in node]
        return node

    result: dict[str, Any] = scrub(data)
    return result
