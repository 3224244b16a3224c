"""The health engine: probes every checker target on its own schedule and keeps node states.

Targets come from the checker kinds of each ingress's upstream groups. Each target runs in
its own task: probe all nodes (a shared concurrency bound), update their state machines,
and when a node starts or stops being routed, ask the reconciler to re-plan that ingress
(its ejected servers leave the load balancer through the normal, guarded write path).
Since a target is probed once per interval, a node's routing changes at most once per
interval: flapping is damped by construction.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from loguru import logger

from ..errors import ValidationFailed
from ..ingress import Ingress
from ..keys import IngressRef
from ..metrics import Metrics, Sample
from ..supervisor import Supervisor
from ..tracing.hooks import NO_TRACING, Tracing
from . import report
from .checkers import CheckerKind, CheckerTarget, targets_of
from .notify import Transitions
from .passive import PassiveHealth
from .schedule import Prober, probe_target
from .shared import SharedHealth
from .state import NodeHealth, State


class Replan(Protocol):
    """Where a routing change is sent: the ingress is planned again (its ejections change)."""

    def mark_dirty(self, refs: Sequence[IngressRef], reason: str) -> None:
        """Re-plan these ingresses soon."""
        ...

class HealthEngine:
    """Node states for every checked ingress; `ejected()` is what rendering leaves out."""

    def __init__(
        self,
        kinds: dict[str, CheckerKind],
        replan: Replan,
        *,
        concurrency: int = 256,
        shared: SharedHealth | None = None,
        rendered_urls: Callable[[IngressRef], frozenset[str]] | None = None,
        passive: PassiveHealth | None = None,
        transitions: Transitions | None = None,
        clock: Callable[[], float] = time.monotonic,
        supervisor: Supervisor | None = None,
        metrics: Metrics | None = None,
        tracing: Tracing = NO_TRACING,
    ) -> None:
        """`shared`: set on every exporter sharing a root (followers read the leader's states from it);
        `rendered_urls`: the server URLs an ingress's load balancers hold in etcd right now;
        `passive`: passive health, whose ejections add to the probes'; `transitions`: told of every
        routed / not routed change of a node (the leader's notifications); `supervisor`: runs the probe tasks (a crash
        is logged, counted and restarted); `metrics`: where probes are counted; `tracing`: a span per probe that changed a state."""
        self.kinds, self._tracing = kinds, tracing
        self._replan = replan
        self._clock = clock
        self._metrics = metrics or Metrics()
        self._prober = Prober(concurrency, self._metrics)
        self._metrics.health_nodes.read_from(self.state_counts)
        self._checked: dict[IngressRef, dict[str, report.Checked]] = {}
        self._running = False
        self._shared = shared
        self._rendered_urls = rendered_urls
        self.passive = passive
        self._transitions = transitions
        self._supervisor = supervisor if supervisor is not None else Supervisor()

    # ----- targets

    def targets_of(self, ingress: Ingress) -> list[CheckerTarget]:
        """The checker targets an ingress declares through its upstream kinds."""
        return targets_of(self.kinds, ingress)

    def admit(self, ingress: Ingress) -> None:
        """Refuse an ingress whose upstream kind no installed plugin provides."""
        for loc, group in (("upstream", ingress.upstream), ("canary.upstream", ingress.canary.upstream if ingress.canary else None)):
            if group is not None and group.needs_plugin and group.kind not in self.kinds:
                raise ValidationFailed(
                    f"{loc}.kind: no checker plugin provides kind {group.kind!r}",
                    {"errors": [{"loc": f"ingresses.{ingress.authority}/{ingress.id}.{loc}.kind", "msg": f"unknown kind {group.kind!r}"}]},
                )

    def update(self, owner: IngressRef, ingress: Ingress | None) -> None:
        """Follow a record change: keep states of nodes that stay, start new ones, drop the rest."""
        old = self._checked.pop(owner, {})
        new: dict[str, report.Checked] = {}
        for target in self.targets_of(ingress) if ingress is not None else []:
            previous = old.pop(target.name, None)
            now = self._clock()
            nodes = {n.url: (previous.nodes.get(n.url) if previous else None) or NodeHealth(added_at=now) for n in target.nodes}
            checked = report.Checked(target, nodes)
            if previous is not None and previous.target.check == target.check and previous.task is not None:
                checked.task = previous.task  # same schedule; the task reads the new node set
                previous.task = None
            new[target.name] = checked
            if checked.task is None and self._running:
                checked.task = self._spawn_probe(owner, target.name)
        for gone in old.values():
            if gone.task is not None:
                gone.task.cancel()
            self._prober.forget(gone.target.name)
        if ingress is None and self.passive is not None:
            self.passive.forget(owner)
        if new:
            self._checked[owner] = new
        if self._running and self._shared is not None and (old or ingress is None):
            self._shared.publish([owner])

    def ejected(self, owner: IngressRef, ingress: Ingress) -> frozenset[str]:
        """URLs that must not receive traffic: nodes not routed, and checked nodes not probed yet.

        An exporter that is not probing (a follower) uses the states the leader published.
        """
        if (shared := self._followed()) is not None:
            doc = shared.docs.get(owner) or {}
            published = doc.get("nodes", {})
            out = set(doc.get("passive", ()))
            for target in self.targets_of(ingress):
                for node in target.nodes:
                    if published.get(node.url, {}).get("status") not in (State.HEALTHY.value, State.MOSTLY_HEALTHY.value):
                        out.add(node.url)
            return frozenset(out)
        return self.active_ejected(owner, ingress) | (self.passive.ejected(owner) if self.passive else frozenset())

    def active_ejected(self, owner: IngressRef, ingress: Ingress) -> frozenset[str]:
        """What the probes alone keep out (the leader's own states)."""
        out: set[str] = set()
        known = self._checked.get(owner, {})
        for target in self.targets_of(ingress):
            checked = known.get(target.name)
            for node in target.nodes:
                health = checked.nodes.get(node.url) if checked else None
                if health is None or not health.routed:
                    out.add(node.url)
        return frozenset(out)

    # ----- probing

    async def start(self) -> None:
        """Start probing every known target, from the published states when there are any."""
        self._adopt_published()
        self._running = True
        for owner, targets in self._checked.items():
            for name, checked in targets.items():
                if checked.task is None:
                    checked.task = self._spawn_probe(owner, name)

    def _spawn_probe(self, owner: IngressRef, name: str) -> asyncio.Task[None]:
        return self._supervisor.spawn(f"probe {name}", functools.partial(self._run, owner, name), group="health-probe")

    def _adopt_published(self) -> None:
        # A new leader continues from its predecessor's states: no burst of spurious ejections.
        if self._shared is None:
            return
        now = self._clock()
        if self.passive is not None:
            self.passive.adopt(self._shared.docs)
        for owner, targets in self._checked.items():
            published = (self._shared.docs.get(owner) or {}).get("nodes", {})
            rendered = self._rendered_urls(owner) if self._rendered_urls is not None else frozenset()
            for checked in targets.values():
                for url, health in checked.nodes.items():
                    health.adopt(published.get(url), url in rendered, now - checked.target.check.initial_delay)

    def document(self, owner: IngressRef) -> dict[str, Any] | None:
        """What the leader publishes for one ingress (None: no checkers and no passive ejection)."""
        return report.document(owner, self._checked.get(owner, {}), self.passive)

    def node(self, owner: IngressRef, url: str) -> NodeHealth | None:
        """The probed state of one server of `owner` (None: no active check covers it)."""
        for checked in self._checked.get(owner, {}).values():
            if url in checked.nodes:
                return checked.nodes[url]
        return None

    def routing_changed(self, owner: IngressRef, node: str, routed: bool, reason: str, announce: bool = True) -> None:
        """A node of `owner` starts or stops being routed: re-plan the ingress, publish, notify (when `announce`)."""
        self._replan.mark_dirty([owner], "health")
        if self._shared is not None:
            self._shared.publish([owner])
        if announce and self._transitions is not None:
            self._transitions.transition(owner, node, routed, reason)

    async def stop(self) -> None:
        """Stop every probe task (states are kept)."""
        self._running = False
        tasks = [c.task for t in self._checked.values() for c in t.values() if c.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for targets in self._checked.values():
            for checked in targets.values():
                checked.task = None

    async def _run(self, owner: IngressRef, name: str) -> None:
        def changed(node: str, health: NodeHealth, outcome: str, started_ns: int) -> None:
            with self._tracing.probe_changed(name, node, started_ns, _change(owner, health, outcome)):
                logger.info("health: {} {} is now {} ({})", name, node, health.state.value, outcome)
                if self.passive is None or node not in self.passive.ejected(owner):
                    self.routing_changed(owner, node, health.routed, f"active: {outcome}")

        await probe_target(lambda: self._checked.get(owner, {}).get(name), self._prober, self._clock, self._metrics, changed)

    def state_counts(self) -> list[Sample]:
        """Checked nodes per state, from the published states on a follower (the gauge, read at scrape)."""
        if (shared := self._followed()) is not None:
            states: Iterable[State] = (State(n["status"]) for d in shared.docs.values() for n in d.get("nodes", {}).values())
        else:
            states = (h.state for t in self._checked.values() for c in t.values() for h in c.nodes.values())
        counts = dict.fromkeys(State, 0)
        for state in states:
            counts[state] += 1
        return [((state.value,), float(count)) for state, count in counts.items()]

    def _followed(self) -> SharedHealth | None:
        # Not probing, with a leader to read from: report and render the published states.
        return self._shared if not self._running else None

    # ----- views

    def checkers(self, owner: IngressRef | None = None) -> list[dict[str, Any]]:
        """Checker entries in the APISIX /v1/healthcheck shape, ordered by name.

        A follower reports what the leader published, so every exporter answers the same.
        """
        if (shared := self._followed()) is not None:
            return report.published_entries(shared.docs, owner)
        checked = set(self._checked) | (self.passive.owners() if self.passive else set())
        owners = [owner] if owner is not None else sorted(checked)
        return [entry for o in owners for entry in report.entries(o, self._checked.get(o, {}), self.passive)]


def _change(owner: IngressRef, health: NodeHealth, outcome: str) -> dict[str, str]:
    """A node's change of state, as the event on its probe's span."""
    return {"exporter.ingress": str(owner), "exporter.health.state": health.state.value,
            "exporter.health.routed": str(health.routed).lower(), "exporter.health.outcome": outcome}
