"""Probing spread over the sidecars (`health.sharding: on`): each node probed by one sidecar, the leader deciding.

Keys, each on its writer's own lease, so a sidecar's keys die with it:
- `<health>.shards/<identity>`: the announcement, `{"identity", "lease", "view"}`: this sidecar is live,
  and these are the sidecars it sees (what the probed-by-several gauge compares);
- `<health>.shards/<identity>/<authority>/<id>`: its observations of one ingress, `{"lease",
  "targets": {target: {url: state}}}`, rewritten when a node it probes changes state or its share
  changes, and not at all while states hold.

One watch follows the whole prefix, so announcements and observations arrive in revision order: a
sidecar's observation is judged with the announcements etcd held when it was written. The leader takes
a node's state only from its owner (by the leader's view) and only under the lease it announced: a
sidecar whose lease expired is no one's owner, and its writes under the old lease fail in etcd.
Nor does it take a state probed before the one its verdict came from (probe times are wall clock:
the sidecars' clocks are kept in sync, as passive health needs too).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from loguru import logger

from ..errors import EtcdError
from ..etcd.follow import follow_prefix
from ..etcd.store import EtcdStore
from ..etcd.types import KeyValue, Op, WatchEvent
from ..keys import IngressRef, KeyLayout
from ..metrics import Metrics, Sample
from .shards import Announcement, Members, node_key, owner

# Observations of one probe round share a transaction.
_BATCH_DELAY = 0.05
_PER_TXN = 100


class Engine(Protocol):
    """What sharding needs of the health engine."""

    def nodes(self) -> Iterator[tuple[IngressRef, str, str]]:
        """Every checked node: (ingress, target name, url)."""
        ...

    def reschedule(self) -> None:
        """Probe what this sidecar owns now."""
        ...

    def adopt_node(self, ref: IngressRef, target: str, url: str) -> None:
        """Continue a node newly owned from the state the leader published."""
        ...

    def observation(self, ref: IngressRef, owns: Callable[[str, str], bool]) -> dict[str, dict[str, dict[str, Any]]]:
        """The states of the nodes of `ref` that `owns`, by target and url."""
        ...

    def take_observation(self, ref: IngressRef, target: str, url: str, state: dict[str, Any], writer: str) -> None:
        """The leader takes a node's state from the sidecar probing it."""
        ...

    def checked_at(self, ref: IngressRef, target: str, url: str) -> float:
        """When the probe behind the leader's verdict on a node ran (wall clock; 0: never)."""
        ...

    def deciding(self) -> bool:
        """True on the leader."""
        ...


class Shards:
    """This sidecar's share of the probing, its announcement and observations, and everyone else's."""

    def __init__(self, etcd: EtcdStore, layout: KeyLayout, identity: str, metrics: Metrics) -> None:
        self._etcd, self._layout, self.identity = etcd, layout, identity
        self.members = Members()
        self.engine: Engine | None = None
        self._lease = 0
        self._observed: dict[str, dict[IngressRef, dict[str, Any]]] = {}
        self._queued: set[IngressRef] = set()
        self._written: set[IngressRef] = set()
        self._wake, self._announce = asyncio.Event(), asyncio.Event()
        metrics.shard_targets.read_from(self.targets_per_sidecar)
        metrics.probed_by_several.read_from(lambda: [((), float(self.members.probed_by_several(self._node_keys())))])

    # ----- ownership

    def owns(self, target: str, url: str) -> bool:
        """True when this sidecar probes the node (only once it has seen its own announcement)."""
        return self.members.owner(target, url) == self.identity

    def prober(self, target: str, url: str) -> str | None:
        """The sidecar probing a node now (None: no sidecar is live)."""
        return self.members.owner(target, url)

    def forget(self, target: str, nodes: Iterable[str]) -> None:
        """A target is gone: drop its nodes' cached owners."""
        for url in nodes:
            self.members.forget(target, url)

    def targets_per_sidecar(self) -> list[Sample]:
        """Nodes each live sidecar probes (the gauge, read at scrape)."""
        return [((identity,), float(n)) for identity, n in sorted(self.members.shares(self._node_keys()).items())]

    def _node_keys(self) -> Iterator[tuple[str, str]]:
        return ((target, url) for _, target, url in self.engine.nodes()) if self.engine is not None else iter(())

    # ----- this sidecar's keys

    def lease_changed(self, lease: int) -> None:
        """A new lease (or none): what was queued or written under the old one is gone; announce again."""
        self._lease = lease
        self._queued.clear()
        self._written.clear()
        before = self.members.identities()
        self._take_announcement(self.identity, None)
        self._after(before)
        self._announce.set()

    def observed(self, ref: IngressRef) -> None:
        """A node of `ref` this sidecar probes changed state: rewrite its observation soon."""
        self._queued.add(ref)
        self._wake.set()

    async def run(self) -> None:
        """Announce, publish observations and follow every sidecar's, until cancelled."""
        follow = follow_prefix(self._etcd, self._layout.shards_dir, self._listed, self._changed)
        await asyncio.gather(self._announcer(), self._publisher(), follow)

    async def _announcer(self) -> None:
        while True:
            await self._announce.wait()
            self._announce.clear()
            if not (lease := self._lease):
                continue
            value = json.dumps({"identity": self.identity, "lease": lease, "view": list(self.members.identities())})
            try:
                await self._etcd.txn([], [Op(self._layout.shard_key(self.identity), value, lease=lease)])
            except EtcdError as exc:
                logger.debug("shard announcement not written ({}); will retry", exc.title)
                await asyncio.sleep(1)
                self._announce.set()

    async def _publisher(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(_BATCH_DELAY)
            self._wake.clear()
            lease, refs = self._lease, sorted(self._queued)
            self._queued.clear()
            if not lease or self.identity not in self.members.live:
                continue  # no share: becoming a member queues every ingress it gains
            for start in range(0, len(refs), _PER_TXN):
                if not await self._write(lease, refs[start : start + _PER_TXN]):
                    if self._lease == lease:
                        self._queued.update(refs[start:])
                        self._wake.set()
                    await asyncio.sleep(1)
                    break

    async def _write(self, lease: int, refs: list[IngressRef]) -> bool:
        assert self.engine is not None
        ops, written, gone = [], set(), set()
        for ref in refs:
            key = self._layout.observation_key(self.identity, ref)
            if targets := self.engine.observation(ref, self.owns):
                ops.append(Op(key, json.dumps({"lease": lease, "targets": targets}), lease=lease))
                written.add(ref)
            elif ref in self._written:
                ops.append(Op(key, None))
                gone.add(ref)
        if not ops:
            return True
        try:
            await self._etcd.txn([], ops)
        except EtcdError as exc:
            logger.warning("health observations not published ({}); will retry", exc.title)
            return False
        if self._lease == lease:
            self._written = (self._written | written) - gone
        return True

    # ----- everyone's keys

    def _listed(self, kvs: list[KeyValue]) -> None:
        before = self.members.identities()
        present = {kv.key for kv in kvs}
        for identity in list(self.members.live):
            if self._layout.shard_key(identity) not in present:
                self._take_announcement(identity, None)
        self._observed = {}
        for kv in kvs:
            self._take(kv.key, kv.value)
        self._after(before, force=True)

    def _changed(self, events: list[WatchEvent]) -> None:
        before = self.members.identities()
        for event in events:
            self._take(event.key, event.value)
        self._after(before)

    def _take(self, key: str, value: str | None) -> None:
        where = self._layout.shard_of(key)
        if where is None:
            return
        identity, ref = where
        doc = _json(key, value)
        if ref is None:
            lease = doc.get("lease") if doc is not None else None
            self._take_announcement(identity, Announcement(lease, tuple(doc.get("view", ()))) if isinstance(lease, int) and doc else None)
            return
        docs = self._observed.setdefault(identity, {})
        if doc is None:
            docs.pop(ref, None)
            return
        docs[ref] = doc
        if self.engine is not None and self.engine.deciding():
            self._apply(identity, ref, doc)

    def _take_announcement(self, identity: str, announcement: Announcement | None) -> None:
        # This sidecar counts itself only under the lease it holds now.
        if identity == self.identity and announcement is not None and announcement.lease != self._lease:
            announcement = None
        self.members.set(identity, announcement)

    def _after(self, before: tuple[str, ...], force: bool = False) -> None:
        if self.members.identities() == before and not force:
            return
        self._reshard(before)
        self._announce.set()
        if self.engine is not None and self.engine.deciding():
            self.apply_all()

    def _reshard(self, before: tuple[str, ...]) -> None:
        # Nodes gained continue from the published verdict; the observations of every ingress whose share moved are rewritten.
        if self.engine is None:
            return
        me, moved = self.identity, set()
        for ref, target, url in self.engine.nodes():
            was, now = owner(before, node_key(target, url)) == me, self.owns(target, url)
            if now and not was:
                self.engine.adopt_node(ref, target, url)
            if now != was:
                moved.add(ref)
        if moved:
            logger.info("health: probing of {} ingresses moves between sidecars (now {})", len(moved), ", ".join(self.members.identities()))
            self._queued |= moved
            self._wake.set()
        self.engine.reschedule()

    # ----- the leader

    def apply_all(self) -> None:
        """The leader takes every observation it may (on becoming leader, and when the sidecars change)."""
        for writer, docs in self._observed.items():
            for ref, doc in docs.items():
                self._apply(writer, ref, doc)

    def _apply(self, writer: str, ref: IngressRef, doc: dict[str, Any]) -> None:
        announced = self.members.live.get(writer)
        if self.engine is None or writer == self.identity or announced is None or doc.get("lease") != announced.lease:
            return  # its own states are current; an observation under a lease no longer announced is no verdict
        targets = doc.get("targets")
        for target, nodes in targets.items() if isinstance(targets, dict) else ():
            for url, state in nodes.items() if isinstance(nodes, dict) else ():
                if isinstance(state, dict) and self.members.owner(target, url) == writer and _fresh(self.engine, ref, target, url, state):
                    self.engine.take_observation(ref, target, url, state, writer)


def _fresh(engine: Engine, ref: IngressRef, target: str, url: str, state: dict[str, Any]) -> bool:
    # An owner's entry written before its node moved away and back again is older than the verdict
    # another owner gave meanwhile: a verdict never moves to an older probe.
    at = state.get("checked_at", 0)
    return isinstance(at, int | float) and at >= engine.checked_at(ref, target, url)


def _json(key: str, value: str | None) -> dict[str, Any] | None:
    if value is None:
        return None
    try:
        doc = json.loads(value)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        logger.error("ignoring {}: not a JSON object", key)
        return None
    return doc
