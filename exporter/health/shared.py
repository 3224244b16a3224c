"""One health truth for N exporters: the leader publishes, everyone reads.

The leader writes one document per checked ingress under `health.prefix`
(`<prefix>/<authority>/<id>`) when one of its nodes changes routing state (only then), in
transactions fenced by the election key. Every exporter watches the prefix: followers render
and report (`/v1/healthcheck`) the leader's states, and a new leader starts from them instead
of from scratch, so a failover causes no burst of ejections.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from loguru import logger

from ..errors import EtcdError
from ..etcd.follow import follow_prefix
from ..etcd.store import EtcdStore
from ..etcd.types import KeyValue, Op, WatchEvent
from ..keys import IngressRef, KeyLayout
from ..roles import LeaderPolicy

# The document the leader publishes for one ingress (None: it has no checkers).
Document = Callable[[IngressRef], "dict[str, Any] | None"]


class SharedHealth:
    """Published health documents, kept in sync with etcd; `publish()` queues an ingress's document."""

    def __init__(self, etcd: EtcdStore, layout: KeyLayout, identity: str, leader: LeaderPolicy) -> None:
        self._etcd = etcd
        self._layout = layout
        self.identity = identity
        self._leader = leader
        self.docs: dict[IngressRef, dict[str, Any]] = {}
        self._queued: set[IngressRef] = set()
        self._wake = asyncio.Event()

    def publish(self, owners: Sequence[IngressRef]) -> None:
        """Queue the current document of these ingresses (leader only)."""
        self._queued.update(owners)
        self._wake.set()

    def leader_and_age(self) -> tuple[str | None, float | None]:
        """The leader that wrote the newest document, and that document's age in seconds."""
        if not self.docs:
            return None, None
        newest = max(self.docs.values(), key=lambda d: float(d.get("at", 0)))
        return newest.get("leader"), max(0.0, time.time() - float(newest.get("at", 0)))

    async def run_publisher(self, document: Document) -> None:
        """Write the queued ingresses' `document`s, many per transaction."""
        while True:
            await self._wake.wait()
            await asyncio.sleep(0.05)  # transitions of one probe round share a transaction
            self._wake.clear()
            owners, self._queued = sorted(self._queued), set()
            fence = list(self._leader.fence())
            if not fence:
                continue  # deposed: the new leader publishes
            for start in range(0, len(owners), 100):
                ops = []
                for owner in owners[start : start + 100]:
                    doc = document(owner)
                    key = self._layout.health_key(owner)
                    ops.append(Op(key, None if doc is None else json.dumps({"leader": self.identity, "at": time.time(), **doc})))
                try:
                    result = await self._etcd.txn(fence, ops)
                except EtcdError as exc:
                    logger.warning("could not publish health ({}); will retry", exc.title)
                    self._queued.update(owners[start:])
                    self._wake.set()
                    await asyncio.sleep(1)
                    break
                if not result.succeeded:
                    logger.info("health not published: this exporter is no longer the leader")
                    break

    async def run_reader(self, on_change: Callable[[], None]) -> None:
        """Follow the published documents (list, then watch; re-list after any failure); `on_change` after each update."""

        def listed(kvs: list[KeyValue]) -> None:
            self.docs = {}
            for kv in kvs:
                self._apply(kv.key, kv.value)
            on_change()

        def changed(events: list[WatchEvent]) -> None:
            for event in events:
                self._apply(event.key, event.value)
            on_change()

        await follow_prefix(self._etcd, self._layout.health_dir, listed, changed)

    def _apply(self, key: str, value: str | None) -> None:
        owner = self._layout.health_ref(key)
        if owner is None:
            return
        if value is None:
            self.docs.pop(owner, None)
            return
        try:
            self.docs[owner] = json.loads(value)
        except ValueError:
            logger.error("ignoring health document {}: not JSON", key)
