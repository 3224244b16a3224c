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

from ..etcd.client import Compare, EtcdClient, EtcdError, Op, WatchCanceled

Owner = tuple[str, str]


class SharedHealth:
    """Published health documents, kept in sync with etcd; `publish()` queues an ingress's document."""

    def __init__(self, etcd: EtcdClient, prefix: str, identity: str) -> None:
        self.etcd = etcd
        self.prefix = prefix.rstrip("/")
        self.identity = identity
        self.docs: dict[Owner, dict[str, Any]] = {}
        self.fence: Callable[[], Sequence[Compare]] = lambda: ()
        self.document: Callable[[Owner], dict[str, Any] | None] = lambda _owner: None
        self._queued: set[Owner] = set()
        self._wake = asyncio.Event()
        # Told when the documents change (followers' metrics follow the leader's states).
        self.on_docs_changed: Callable[[], None] = lambda: None

    def key(self, owner: Owner) -> str:
        """Where an ingress's document lives."""
        return f"{self.prefix}/{owner[0]}/{owner[1]}"

    def publish(self, owners: Sequence[Owner]) -> None:
        """Queue the current document of these ingresses (leader only)."""
        self._queued.update(owners)
        self._wake.set()

    def leader_and_age(self) -> tuple[str | None, float | None]:
        """The leader that wrote the newest document, and that document's age in seconds."""
        if not self.docs:
            return None, None
        newest = max(self.docs.values(), key=lambda d: float(d.get("at", 0)))
        return newest.get("leader"), max(0.0, time.time() - float(newest.get("at", 0)))

    async def run_publisher(self) -> None:
        """Write queued documents, many ingresses per transaction."""
        while True:
            await self._wake.wait()
            await asyncio.sleep(0.05)  # transitions of one probe round share a transaction
            self._wake.clear()
            owners, self._queued = sorted(self._queued), set()
            fence = list(self.fence())
            if not fence:
                continue  # deposed: the new leader publishes
            for start in range(0, len(owners), 100):
                ops = []
                for owner in owners[start : start + 100]:
                    doc = self.document(owner)
                    if doc is None:
                        ops.append(Op(self.key(owner), None))
                    else:
                        ops.append(Op(self.key(owner), json.dumps({"leader": self.identity, "at": time.time(), **doc})))
                try:
                    result = await self.etcd.txn(fence, ops)
                except EtcdError as exc:
                    logger.warning("could not publish health ({}); will retry", exc)
                    self._queued.update(owners[start:])
                    self._wake.set()
                    await asyncio.sleep(1)
                    break
                if not result.succeeded:
                    logger.info("health not published: this exporter is no longer the leader")
                    break

    async def run_reader(self) -> None:
        """Follow the published documents (list, then watch; re-list after any failure)."""
        backoff = 0.2
        while True:
            try:
                page = await self.etcd.range_prefix(self.prefix + "/")
                self.docs = {}
                for kv in page.kvs:
                    self._apply(kv.key, kv.value)
                self.on_docs_changed()
                async for events in self.etcd.watch_prefix(self.prefix + "/", page.revision + 1, idle_timeout=60):
                    for event in events:
                        self._apply(event.key, event.value)
                    self.on_docs_changed()
                    backoff = 0.2
            except (EtcdError, WatchCanceled) as exc:
                logger.debug("health watch ended ({}); re-listing", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    def _apply(self, key: str, value: str | None) -> None:
        parts = key[len(self.prefix) + 1 :].split("/")
        if len(parts) != 2:
            return
        owner = (parts[0], parts[1])
        if value is None:
            self.docs.pop(owner, None)
            return
        try:
            self.docs[owner] = json.loads(value)
        except ValueError:
            logger.error("ignoring health document {}: not JSON", key)
