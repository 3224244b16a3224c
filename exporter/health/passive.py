"""Passive health: what real requests through Traefik say about each server (pure state; no I/O).

Every sidecar counts, per server, the consecutive failed requests its own Traefik logged (a
success resets its count). The leader adds the counts every sidecar reports and ejects a
server whose total reaches `max_failures`, within the safety rails: passive ejections never
take more than `max_ejection_percent` of a group's routable servers, and never its last one.
The n-th consecutive ejection of a server lasts n x `base_ejection_time` (at most
`max_ejection_time`); when it ends the server returns at once, or, when its group has active
checks, only after an active probe passes. Times are wall-clock seconds, so they can be
published and compared between sidecars.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..ingress import Ingress
from ..keys import IngressRef, KeyLayout
from ..metrics import Metrics
from .accesslog import Request

# The server and instance URLs of a stored ingress (empty when there is none).
UrlsOf = Callable[[IngressRef], frozenset[str]]


@dataclass(frozen=True, slots=True)
class PassivePolicy:
    """The passive-health settings (`health.passive`)."""

    max_failures: int = 5
    failure_statuses: frozenset[int] = frozenset({502, 503, 504})
    base_ejection_time: float = 30.0
    max_ejection_time: float = 300.0
    max_ejection_percent: int = 50

    def ejection_time(self, n: int) -> float:
        """How long the n-th consecutive ejection of a server lasts."""
        return min(n * self.base_ejection_time, self.max_ejection_time)

    def may_eject(self, routable: int, ejected: int) -> bool:
        """Whether one more of a group's `routable` servers may go, `ejected` of them being out already."""
        return routable - ejected >= 2 and ejected + 1 <= math.floor(routable * self.max_ejection_percent / 100)


@dataclass(slots=True)
class Run:
    """Consecutive failed requests to one server seen by one sidecar, and when the first of them was."""

    count: int = 0
    first_at: float = 0.0


@dataclass(slots=True)
class Ejection:
    """A server out of its load balancer because of passive health."""

    until: float
    n: int
    at: float
    expired_at: float | None = None  # the time is over; waiting for an active probe to pass

    def published(self) -> dict[str, Any]:
        """The form in the published health document."""
        return {"until": self.until, "n": self.n, "at": self.at, "expired_at": self.expired_at}


def members_of(ingress: Ingress) -> list[tuple[str, list[tuple[str, float]]]]:
    """(group label, (server or instance URL, weight) of each member) of each upstream group."""
    out = []
    for label, upstream in (("primary", ingress.upstream), ("canary", ingress.canary.upstream if ingress.canary else None)):
        if upstream is None:
            continue
        out.append((label, [(m.url, m.weight) for m in upstream.members()]))
    return out


def groups_of(ingress: Ingress) -> list[tuple[str, list[str]]]:
    """(group label, server or instance URLs) of each upstream group."""
    return [(label, [url for url, _ in members]) for label, members in members_of(ingress)]


def group_of(ingress: Ingress | None, url: str) -> str:
    """The label of the group `url` belongs to (`primary` when it is in none)."""
    return next((label for label, urls in groups_of(ingress) if url in urls), "primary") if ingress else "primary"


def server_urls(ingress: Ingress | None) -> frozenset[str]:
    """Every server and instance URL of `ingress` (empty for none)."""
    return frozenset(u for _, urls in groups_of(ingress) for u in urls) if ingress else frozenset()


@dataclass
class PassiveHealth:
    """Failure runs (this sidecar's and its peers'), and the leader's ejections."""

    policy: PassivePolicy
    layout: KeyLayout
    runs: dict[IngressRef, dict[str, Run]] = field(default_factory=dict)
    peers: dict[str, dict[tuple[IngressRef, str], Run]] = field(default_factory=dict)
    ejections: dict[IngressRef, dict[str, Ejection]] = field(default_factory=dict)
    # (server -> (n of its last ejection, when it returned)): is a new ejection consecutive?
    returned: dict[tuple[IngressRef, str], tuple[int, float]] = field(default_factory=dict)
    # On a follower: the servers the leader's published documents say are passively ejected.
    published_ejections: dict[IngressRef, frozenset[str]] = field(default_factory=dict)
    metrics: Metrics = field(default_factory=Metrics)

    # ----- observations

    def observe(self, requests: Iterable[Request], urls_of: UrlsOf, now: float) -> set[IngressRef]:
        """Count requests to the servers of known ingresses; the ingresses whose counts changed."""
        changed: set[IngressRef] = set()
        known: dict[IngressRef, frozenset[str]] = {}
        for request in requests:
            owner = self.layout.owner_of_object(request.service)
            if owner is None:
                continue
            urls = known.get(owner)
            if urls is None:
                urls = known[owner] = urls_of(owner)
            if request.url not in urls or self._is_out(owner, request.url):
                continue  # an ejected server's lines are requests sent before Traefik applied the ejection
            runs = self.runs.setdefault(owner, {})
            run = runs.get(request.url)
            if request.failed:
                self.metrics.passive_failures.inc()
                if run is None:
                    run = runs[request.url] = Run(0, now)
                run.count += 1
                changed.add(owner)
            elif run is not None:
                del runs[request.url]
                changed.add(owner)
        return changed

    def _is_out(self, owner: IngressRef, url: str) -> bool:
        return url in self.ejections.get(owner, ()) or url in self.published_ejections.get(owner, ())

    def report(self) -> list[list[Any]]:
        """This sidecar's runs, as published for the leader: `[authority, id, url, count, first_at]`."""
        return [[o.authority, o.id, url, r.count, r.first_at] for o, runs in sorted(self.runs.items()) for url, r in runs.items()]

    def set_peer(self, identity: str, report: list[list[Any]] | None) -> set[IngressRef]:
        """Take a peer's published runs (None: the peer is gone); the ingresses concerned."""
        old = self.peers.pop(identity, {})
        new: dict[tuple[IngressRef, str], Run] = {}
        for authority, ingress_id, url, count, first_at in report or []:
            new[(IngressRef(str(authority), str(ingress_id)), str(url))] = Run(int(count), float(first_at))
        if new:
            self.peers[identity] = new
        return {owner for owner, _ in old.keys() | new.keys()}

    def failures(self, owner: IngressRef, url: str) -> int:
        """Consecutive failures of one server summed over the sidecars, counting only runs begun after its last ejection."""
        local = self.runs.get(owner, {}).get(url)
        total = local.count if local else 0
        since = self._last_ejected_at(owner, url)
        for runs in self.peers.values():
            run = runs.get((owner, url))
            if run is not None and run.first_at > since:
                total += run.count
        return total

    def _last_ejected_at(self, owner: IngressRef, url: str) -> float:
        ejection = self.ejections.get(owner, {}).get(url)
        if ejection is not None:
            return ejection.at
        return self.returned.get((owner, url), (0, -math.inf))[1]

    def follow_leader(self, docs: dict[IngressRef, dict[str, Any]]) -> bool:
        """On a follower: take the leader's published ejections; True when runs were dropped (see `forget_runs`)."""
        self.published_ejections = {owner: frozenset(doc["passive"]) for owner, doc in docs.items() if doc.get("passive")}
        dropped = False
        for owner, doc in docs.items():
            if doc.get("passive") and self.forget_runs(owner, doc["passive"]):
                dropped = True
        return dropped

    def forget_runs(self, owner: IngressRef, ejected: dict[str, Any]) -> bool:
        """Drop this sidecar's runs that began before the leader's ejection of their server (a new run starts after it)."""
        runs = self.runs.get(owner, {})
        stale = [url for url, e in ejected.items() if url in runs and runs[url].first_at <= float(e["at"])]
        for url in stale:
            del runs[url]
        return bool(stale)

    # ----- the leader's decisions

    def decide(self, owner: IngressRef, ingress: Ingress, active_ejected: frozenset[str], now: float) -> Iterator[tuple[str, str, str]]:
        """Eject the servers of `ingress` whose failures reached the limit, within the rails.

        Yields (group, url, reason) for each new ejection.
        """
        current = self.ejections.get(owner, {})
        for label, urls in groups_of(ingress):
            routable = [u for u in urls if u not in active_ejected]
            for url in routable:
                total = self.failures(owner, url)
                if url in current or total < self.policy.max_failures:
                    continue
                out = sum(1 for u in routable if u in current)
                if not self.policy.may_eject(len(routable), out):
                    continue
                current = self.ejections.setdefault(owner, current)
                last_n, returned_at = self.returned.pop((owner, url), (0, -math.inf))
                n = last_n + 1 if now - returned_at < self.policy.max_ejection_time else 1
                current[url] = Ejection(until=now + self.policy.ejection_time(n), n=n, at=now)
                self.runs.get(owner, {}).pop(url, None)
                self.metrics.passive_ejections.inc()
                yield label, url, f"passive: {total} consecutive failed requests"

    def due(self, now: float) -> Iterator[tuple[IngressRef, str, Ejection]]:
        """Ejections whose time is over (including those already waiting for a probe)."""
        for owner, ejections in self.ejections.items():
            for url, ejection in ejections.items():
                if ejection.until <= now:
                    yield owner, url, ejection

    def release(self, owner: IngressRef, url: str, now: float) -> None:
        """The server returns to its load balancer."""
        ejections = self.ejections.get(owner, {})
        ejection = ejections.pop(url, None)
        if not ejections:
            self.ejections.pop(owner, None)
        if ejection is not None:
            self.returned[(owner, url)] = (ejection.n, now)

    def node_entry(self, owner: IngressRef, url: str) -> dict[str, Any]:
        """What `/v1/healthcheck` adds to a node: its consecutive failed requests, and its ejection."""
        ejection = self.ejections.get(owner, {}).get(url)
        out: dict[str, Any] = {"passive_failure": self.failures(owner, url)}
        if ejection is not None:
            out["passive_ejection"] = ejection.published()
        return out

    def owners(self) -> set[IngressRef]:
        """The ingresses with a failure run or an ejection."""
        return {o for o, runs in self.runs.items() if runs} | set(self.ejections) | {o for p in self.peers.values() for o, _ in p}

    def urls(self, owner: IngressRef) -> set[str]:
        """The servers of `owner` with a failure run or an ejection."""
        return set(self.runs.get(owner, ())) | set(self.ejections.get(owner, ())) | {
            u for p in self.peers.values() for o, u in p if o == owner
        }

    def ejected(self, owner: IngressRef) -> frozenset[str]:
        """URLs passive health keeps out of `owner`'s load balancers now."""
        return frozenset(self.ejections.get(owner, ()))

    def forget(self, owner: IngressRef) -> None:
        """The ingress is gone."""
        self.runs.pop(owner, None)
        self.ejections.pop(owner, None)
        for key in [k for k in self.returned if k[0] == owner]:
            del self.returned[key]

    # ----- publishing

    def published(self, owner: IngressRef) -> dict[str, Any]:
        """The passive part of `owner`'s health document (empty: nothing to say)."""
        ejections = self.ejections.get(owner)
        return {"passive": {url: e.published() for url, e in ejections.items()}} if ejections else {}

    def adopt(self, docs: dict[IngressRef, dict[str, Any]]) -> None:
        """On becoming leader: continue the ejections the previous leader published (and stop following them)."""
        self.published_ejections = {}
        for owner, doc in docs.items():
            if doc.get("passive"):
                self.ejections[owner] = {
                    url: Ejection(until=float(e["until"]), n=int(e["n"]), at=float(e["at"]),
                                  expired_at=None if e.get("expired_at") is None else float(e["expired_at"]))
                    for url, e in doc["passive"].items()
                }
