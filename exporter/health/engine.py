"""The health engine: probes every checker target on its own schedule and keeps node states.

Targets come from the checker kinds of each ingress's upstream groups. Each target runs in
its own task: probe all nodes (a shared concurrency bound), update their state machines,
and when a node starts or stops being routed, ask the reconciler to re-plan that ingress
(its ejected servers leave the load balancer through the normal, guarded write path).
Since a target is probed once per interval, a node's routing changes at most once per
interval: flapping is damped by construction.

With sharding (`shards` set), every sidecar probes its share of the nodes and publishes their
states; the leader alone decides (`deciding()`), from its own share and everyone's observations.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from loguru import logger

from ..errors import ValidationFailed
from ..ingress import Ingress
from ..keys import IngressRef
from ..metrics import Metrics
from ..supervisor import Supervisor
from ..tracing.hooks import NO_TRACING, Tracing
from . import report
from .checkers import CheckerKind
from .nodes import NodeStates
from .notify import Transitions
from .passive import PassiveHealth
from .schedule import Prober, probe_target
from .sharding import Shards
from .shared import SharedHealth
from .state import NodeHealth


class Replan(Protocol):
    """Where a routing change is sent: the ingress is planned again (its ejections change)."""

    def mark_dirty(self, refs: Sequence[IngressRef], reason: str) -> None:
        """Re-plan these ingresses soon."""
        ...

class HealthEngine(NodeStates):
    """Probes the checked nodes and keeps their states; `ejected()` is what rendering leaves out."""

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
        identity: str | None = None,
    ) -> None:
        """`shared`: set on every exporter sharing a root (followers read the leader's states from it);
        `rendered_urls`: the server URLs an ingress's load balancers hold in etcd right now;
        `passive`: passive health, whose ejections add to the probes'; `transitions`: told of every
        routed / not routed change of a node (the leader's notifications); `supervisor`: runs the probe tasks (a crash
        is logged, counted and restarted); `metrics`: where probes are counted; `tracing`: a span per probe that changed a state;
        `identity`: the sidecar's, named in its probes' User-Agent."""
        self.kinds, self._tracing = kinds, tracing
        self._replan = replan
        self._clock = clock
        self._metrics = metrics or Metrics()
        self._prober = Prober(concurrency, self._metrics, identity)
        self._metrics.health_nodes.read_from(self.state_counts)
        self._checked: dict[IngressRef, dict[str, report.Checked]] = {}
        # Probing: tasks run (the leader; with sharding, every sidecar). Deciding: verdicts are this engine's.
        self._probing = self._deciding = False
        self._shards: Shards | None = None
        self._shared = shared
        self._rendered_urls = rendered_urls
        self.passive = passive
        self._transitions = transitions
        self._supervisor = supervisor if supervisor is not None else Supervisor()

    # ----- targets

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
        dropped = ingress is None
        for target in self.targets_of(ingress) if ingress is not None else []:
            previous = old.pop(target.name, None)
            now = self._clock()
            nodes = {n.url: (previous.nodes.get(n.url) if previous else None) or NodeHealth(added_at=now) for n in target.nodes}
            dropped |= previous is not None and bool(previous.nodes.keys() - nodes.keys())
            checked = report.Checked(target, nodes)
            if previous is not None and previous.target.check == target.check and previous.task is not None:
                checked.task = previous.task  # same schedule; the task reads the new node set
                previous.task = None
            new[target.name] = checked
            self._schedule(owner, target.name, checked)
        for gone in old.values():
            if gone.task is not None:
                gone.task.cancel()
            self._prober.forget(gone.target.name)
            if self._shards is not None:
                self._shards.forget(gone.target.name, gone.nodes)
        if ingress is None and self.passive is not None:
            self.passive.forget(owner)
        if new:
            self._checked[owner] = new
        if self._deciding and self._shared is not None and (old or ingress is None):
            self._shared.publish([owner])
        if self._shards is not None and (dropped or old):
            self._shards.observed(owner)  # no entry stays published for a node that is gone

    # ----- probing

    def shard_with(self, shards: Shards) -> None:
        """Probe only this sidecar's share of the nodes (`health.sharding: on`)."""
        self._shards = shards
        shards.engine = self

    async def start(self) -> None:
        """Decide, and probe every known target (with sharding, this sidecar's share), from the published states."""
        self._adopt_published()
        self._deciding = self._probing = True
        if self._shards is not None:
            self._shards.apply_all()
        self.reschedule()

    def start_probing(self) -> None:
        """Probe this sidecar's share without deciding (sharding on, not the leader)."""
        self._probing = True
        self.reschedule()

    async def step_down(self) -> None:
        """No longer the leader: stop deciding (and probing, unless sharding spreads it over every sidecar)."""
        if self._shards is None:
            await self.stop()
        self._deciding = False

    def reschedule(self) -> None:
        """Probe what this sidecar probes now: each target's share of nodes, a task for every target with any."""
        for owner, targets in self._checked.items():
            for name, checked in targets.items():
                self._schedule(owner, name, checked)

    def _schedule(self, owner: IngressRef, name: str, checked: report.Checked) -> None:
        if self._shards is not None:
            checked.probed = tuple(n for n in checked.target.nodes if self._shards.owns(name, n.url))
        wanted = self._probing and bool(checked.probed_nodes())
        if wanted and checked.task is None:
            checked.task = self._spawn_probe(owner, name)
        elif not wanted and checked.task is not None:
            checked.task.cancel()
            checked.task = None

    def _spawn_probe(self, owner: IngressRef, name: str) -> asyncio.Task[None]:
        return self._supervisor.spawn(f"probe {name}", functools.partial(self._run, owner, name), group="health-probe")

    def _route(self, owner: IngressRef, url: str, health: NodeHealth, reason: str) -> None:
        # A passive ejection holds whatever the probes say until it ends.
        if self.passive is None or url not in self.passive.ejected(owner):
            self.routing_changed(owner, url, health.routed, reason)

    def routing_changed(self, owner: IngressRef, node: str, routed: bool, reason: str, announce: bool = True) -> None:
        """A node of `owner` starts or stops being routed: re-plan the ingress, publish, notify (when `announce`)."""
        self._replan.mark_dirty([owner], "health")
        if self._shared is not None:
            self._shared.publish([owner])
        if announce and self._transitions is not None:
            self._transitions.transition(owner, node, routed, reason)

    async def stop(self) -> None:
        """Stop every probe task (states are kept)."""
        self._probing = self._deciding = False
        tasks = [c.task for t in self._checked.values() for c in t.values() if c.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for targets in self._checked.values():
            for checked in targets.values():
                checked.task = None

    async def _run(self, owner: IngressRef, name: str) -> None:
        def changed(node: str, health: NodeHealth, outcome: str, started_ns: int, routed: bool) -> None:
            if self._shards is not None:
                self._shards.observed(owner)
            if routed:
                with self._tracing.probe_changed(name, node, started_ns, _change(owner, health, outcome)):
                    logger.info("health: {} {} is now {} ({})", name, node, health.state.value, outcome)
                    if self._deciding:
                        self._route(owner, node, health, f"active: {outcome}")

        await probe_target(lambda: self._checked.get(owner, {}).get(name), self._prober, self._clock, self._metrics, changed)


def _change(owner: IngressRef, health: NodeHealth, outcome: str) -> dict[str, str]:
    """A node's change of state, as the event on its probe's span."""
    return {"exporter.ingress": str(owner), "exporter.health.state": health.state.value,
            "exporter.health.routed": str(health.routed).lower(), "exporter.health.outcome": outcome}
