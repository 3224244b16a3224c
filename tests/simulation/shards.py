"""Shard moves in the simulation: sidecars join, die and pause past their leases while servers change state.

Each sidecar runs the real `Shards` (ownership, announcements, the leader's acceptance of
observations) over one seeded etcd of the shard prefix: puts on a lease etcd refuses once the lease
has expired, and an expired lease deletes its keys. Every sidecar reads that etcd in revision order,
each lagging by its own random amount; a paused sidecar reads nothing and probes nothing. A probe
records the step it ran at, so a state is as fresh as its probe. Sidecar 0 decides (the leader).

Invariants:
- **fresh over stale**: a verdict of the leader changes only to a state probed no earlier than the
  verdict it replaces (a stale observation never outvotes a fresh one);
- **no verdict from an expired lease**: the leader takes a state only from a sidecar whose
  announcement under that lease etcd held at the revision the leader has read;
- **one prober each**: once every live sidecar has read etcd, each node has exactly one live sidecar
  that probes it, and after one round of probes the leader's verdicts are the servers' states.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from exporter.config import Settings
from exporter.errors import EtcdError
from exporter.etcd.types import Compare, Op, TxnResult, WatchEvent
from exporter.health.sharding import Shards
from exporter.keys import IngressRef, KeyLayout
from exporter.metrics import Metrics

STEPS = 300
NODES = [(IngressRef("sim", f"i{n // 2}"), f"sim/i{n // 2}/primary", f"http://10.0.0.{n % 2 + 5}:8000") for n in range(24)]
# Planted defects, each a way of being wrong that one of the invariants names.
DEFECTS: dict[str, bool] = {"takes-from-anyone": False, "adopted-unreported": False}
# A defect that only a rare seed shows, at the seed that found it: the hole its fix closed.
FOUND_AT = {"adopted-unreported": 972541836}


class Failure(Exception):
    """An invariant broke at a step."""

    def __init__(self, invariant: str, step: int, detail: str) -> None:
        super().__init__(f"step {step}: {invariant}: {detail}")
        self.invariant, self.step, self.detail = invariant, step, detail


class ShardEtcd:
    """The shard prefix as etcd holds it: an event log, live leases, and which lease each key is on."""

    def __init__(self) -> None:
        self.events: list[WatchEvent] = []
        self.keys: dict[str, tuple[str, int]] = {}
        self.leases: set[int] = set()
        self._next_lease = 100
        self._announcements: dict[str, list[tuple[int, int | None]]] = {}  # key -> (revision, lease or None)

    def grant(self) -> int:
        self._next_lease += 1
        self.leases.add(self._next_lease)
        return self._next_lease

    def expire(self, lease: int) -> None:
        self.leases.discard(lease)
        for key in [k for k, (_, on) in self.keys.items() if on == lease]:
            self._apply(key, None, 0)

    def _apply(self, key: str, value: str | None, lease: int) -> None:
        if value is None:
            self.keys.pop(key, None)
        else:
            self.keys[key] = (value, lease)
        self.events.append(WatchEvent.of(key, value, len(self.events) + 1))
        if key.count("/") == 1:  # an announcement (the layout of these runs: records.health.shards/<identity>)
            self._announcements.setdefault(key, []).append((len(self.events), json.loads(value)["lease"] if value else None))

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        if any(op.lease and op.lease not in self.leases for op in ops):
            raise EtcdError("requested lease not found")
        for op in ops:
            if op.value is not None or op.key in self.keys:
                self._apply(op.key, op.value, op.lease)
        return TxnResult(True, len(self.events))

    def announced_at(self, revision: int, identity: str, layout: KeyLayout) -> int | None:
        """The lease of `identity`'s announcement etcd held at `revision` (None: none)."""
        history = self._announcements.get(layout.shard_key(identity), [])
        at = bisect.bisect_right([rev for rev, _ in history], revision) - 1
        return history[at][1] if at >= 0 else None


@dataclass
class Prober:
    """One sidecar: its Shards, the states it probed (status, probe step), how far it has read etcd."""

    index: int
    shards: Shards
    states: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    read: int = 0
    alive: bool = True
    paused: bool = False
    unreported: set[tuple[str, str]] = field(default_factory=set)  # adopted, not probed since (NodeHealth.unreported)


class Engine:
    """What Shards asks of a sidecar's health engine, over the simulated states."""

    def __init__(self, sim: ShardSimulation, prober: Prober) -> None:
        self._sim, self._prober = sim, prober

    def nodes(self) -> Iterator[tuple[IngressRef, str, str]]:
        return iter(NODES)

    def reschedule(self) -> None:
        pass

    def adopt_node(self, ref: IngressRef, target: str, url: str) -> None:
        self._prober.states[(target, url)] = self._sim.verdicts[(target, url)]
        if not DEFECTS["adopted-unreported"]:
            self._prober.unreported.add((target, url))

    def observation(self, ref: IngressRef, owns: Callable[[str, str], bool]) -> dict[str, dict[str, dict[str, Any]]]:
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for node_ref, target, url in NODES:
            if node_ref == ref and owns(target, url) and (target, url) in self._prober.states:
                status, at = self._prober.states[(target, url)]
                out.setdefault(target, {})[url] = {"status": status, "checked_at": at}
        return out

    def take_observation(self, ref: IngressRef, target: str, url: str, state: dict[str, Any], writer: str) -> None:
        self._sim.taken(target, url, state, writer)

    def deciding(self) -> bool:
        return self._prober.index == 0

    def checked_at(self, ref: IngressRef, target: str, url: str) -> float:
        return float(self._sim.verdicts[(target, url)][1])


class ShardSimulation:
    """Sidecars sharing the probing of NODES under one seeded schedule."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.etcd = ShardEtcd()
        self.layout = Settings.model_validate({"records_prefix": "records"}).layout()
        self.truth = {(t, u): "healthy" for _, t, u in NODES}
        self.verdicts = {(t, u): ("healthy", 0) for _, t, u in NODES}
        self.probers: list[Prober] = []
        self.step = 0

    def add(self) -> None:
        index = len(self.probers)
        shards = Shards(self.etcd, self.layout, f"sidecar-{index}", Metrics())  # type: ignore[arg-type]
        prober = Prober(index, shards)
        shards.engine = Engine(self, prober)
        self.probers.append(prober)
        self.renew(prober)

    def renew(self, prober: Prober) -> None:
        """A new lease (joining, or back from a pause past the old one's expiry), announced at once."""
        lease = self.etcd.grant()
        prober.shards.lease_changed(lease)
        value = json.dumps({"identity": prober.shards.identity, "lease": lease, "view": []})
        self.etcd._apply(self.layout.shard_key(prober.shards.identity), value, lease)

    def taken(self, target: str, url: str, state: dict[str, Any], writer: str) -> None:
        leader = self.probers[0]
        lease = self.etcd.announced_at(leader.read, writer, self.layout)
        announced = leader.shards.members.live.get(writer)
        if lease is None or announced is None or announced.lease != lease:
            raise Failure("no verdict from an expired lease", self.step, f"{writer}'s state of {url} taken without its announcement")
        status, at = state["status"], int(state["checked_at"])
        current = self.verdicts[(target, url)]
        if status != current[0] and at < current[1]:
            raise Failure("fresh over stale", self.step, f"{target} {url}: {status} probed at {at} replaced {current} (by {writer})")
        if status != current[0] or at > current[1]:
            self.verdicts[(target, url)] = (status, at)

    async def deliver(self, prober: Prober, upto: int | None = None) -> None:
        """Its watch delivers etcd's events up to `upto`, one at a time; then it publishes what moved."""
        end = len(self.etcd.events) if upto is None else min(upto, len(self.etcd.events))
        while prober.read < end:
            prober.read += 1
            prober.shards._changed([self.etcd.events[prober.read - 1]])
        await self.flush(prober)

    async def flush(self, prober: Prober) -> None:
        """What its publisher would write now (writes under an expired lease fail in etcd)."""
        shards = prober.shards
        refs = sorted(shards._queued)
        shards._queued.clear()
        if refs and shards._lease and shards.identity in shards.members.live:
            await shards._write(shards._lease, refs)

    async def probe(self, prober: Prober) -> None:
        """Every node it owns is probed now: a changed state is published under its lease."""
        for ref, target, url in NODES:
            if prober.shards.owns(target, url):
                before = prober.states.get((target, url), ("", -1))[0]
                prober.states[(target, url)] = (self.truth[(target, url)], self.step)
                if prober.index == 0:  # the leader's own probes decide directly
                    self.verdicts[(target, url)] = prober.states[(target, url)]
                if before != self.truth[(target, url)] or (target, url) in prober.unreported:
                    prober.unreported.discard((target, url))
                    prober.shards.observed(ref)
        await self.flush(prober)

    async def run(self) -> None:
        for _ in range(3):
            self.add()
        for self.step in range(1, STEPS + 1):
            await self.act()
            if self.step % 25 == 0:
                await self.settle()

    async def act(self) -> None:
        live = [p for p in self.probers if p.alive]
        choice = self.rng.random()
        followers = [p for p in live if p.index != 0]
        if choice < 0.05 and len(self.probers) < 8:
            self.add()
        elif choice < 0.09 and len(followers) > 1:
            victim = self.rng.choice(followers)
            victim.alive = False
            self.etcd.expire(victim.shards._lease)
        elif choice < 0.14 and followers:
            await self.pause(self.rng.choice(followers))
        elif choice < 0.40:
            node = self.rng.choice(list(self.truth))
            self.truth[node] = "unhealthy" if self.truth[node] == "healthy" else "healthy"
        for prober in live:
            if not prober.paused:
                await self.deliver(prober, prober.read + self.rng.randrange(0, 6))
                if self.rng.random() < 0.5:
                    await self.probe(prober)

    async def pause(self, prober: Prober) -> None:
        """Paused past its lease: the others take its share; back, it publishes what it believed before it reads a thing."""
        prober.paused = True
        self.etcd.expire(prober.shards._lease)
        for other in self.probers:
            if other.alive and other is not prober:
                await self.deliver(other)
                await self.probe(other)
        prober.paused = False
        for ref, _target, _url in NODES:
            prober.shards.observed(ref)
        await self.flush(prober)  # under the old lease: etcd refuses it
        self.renew(prober)

    async def settle(self) -> None:
        live = [p for p in self.probers if p.alive]
        for _ in range(2):
            for prober in live:
                await self.deliver(prober)
                await self.probe(prober)
        while any(p.read < len(self.etcd.events) for p in live):
            for prober in live:
                await self.deliver(prober)
        for _, target, url in NODES:
            owners = [p.index for p in live if p.shards.owns(target, url)]
            if len(owners) != 1:
                raise Failure("one prober each", self.step, f"{target} {url} probed by sidecars {owners}")
            if self.verdicts[(target, url)][0] != self.truth[(target, url)]:
                raise Failure("one prober each", self.step, f"{target} {url}: verdict {self.verdicts[(target, url)]}, "
                              f"the server is {self.truth[(target, url)]}")


def run_shard_seed(seed: int) -> Failure | None:
    """One seed of shard moves (None: nothing found)."""
    logger.disable("exporter.health.sharding")  # a move per step: its log lines would cost more than the run
    try:
        asyncio.run(ShardSimulation(seed).run())
    except Failure as failure:
        return failure
    finally:
        logger.enable("exporter.health.sharding")
    return None


def _take_from_anyone(self: Shards, writer: str, ref: IngressRef, doc: dict[str, Any]) -> None:
    # The leader's acceptance without its two checks: the writer's ownership and its announced lease.
    if self.engine is not None and writer != self.identity:
        for target, nodes in doc.get("targets", {}).items():
            for url, state in nodes.items():
                self.engine.take_observation(ref, target, url, state, writer)


@contextmanager
def planted(defect: str) -> Iterator[None]:
    """Run with one of DEFECTS on."""
    DEFECTS[defect] = True
    original = Shards._apply
    if defect == "takes-from-anyone":
        Shards._apply = _take_from_anyone  # type: ignore[method-assign]
    try:
        yield
    finally:
        DEFECTS[defect] = False
        Shards._apply = original  # type: ignore[method-assign]
