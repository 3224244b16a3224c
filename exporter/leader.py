"""Leader election through etcd: a lease kept alive, and an election key won by a create-revision compare.

Only the leader probes health, repairs drift, runs the periodic reconcile and writes
health-driven changes; each of those transactions carries `fence()`: a compare on the
election key's create_revision. A leader paused past its lease (or partitioned) finds, when
it resumes, that the key was re-created by its successor: its fenced transactions fail and
nothing it planned while deposed is committed. (etcd3gw's `Lock` is not used: a failed
acquire leaks its lease and `with lock:` enters even when not acquired.)
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Callable

from loguru import logger

from .errors import EtcdError
from .etcd.store import EtcdStore
from .etcd.types import Compare, Op
from .metrics import Metrics


def default_identity() -> str:
    """host:pid:random, unique per process."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Leadership:
    """Campaigns for `key`; `is_leader()` and `fence()` tell the rest of the daemon where it stands (a LeaderPolicy).

    Listeners (`add_listener`) are told of every change of leadership (True: this exporter became leader),
    lease listeners (`add_lease_listener`) of every new lease (0: none held).
    """

    def __init__(
        self, etcd: EtcdStore, key: str, ttl: int = 10, *, identity: str | None = None, metrics: Metrics | None = None
    ) -> None:
        self.etcd = etcd
        self.key = key
        self.ttl = ttl
        self.identity = identity or default_identity()
        self._leading = False
        self.leader: str | None = None
        self.create_revision = 0
        self._listeners: list[Callable[[bool], None]] = []
        self._lease_listeners: list[Callable[[int], None]] = []
        self.__lease = 0
        self._last_renewed = 0.0
        self._stopping = False
        (metrics or Metrics()).leader.read_from(lambda: [((), 1.0 if self._leading else 0.0)])

    def is_leader(self) -> bool:
        """True while this exporter holds the election key."""
        return self._leading

    def lease(self) -> int:
        """The lease this exporter campaigns with (0 before the first grant); keys tied to it die with the exporter."""
        return self.__lease

    @property
    def _lease(self) -> int:
        return self.__lease

    @_lease.setter
    def _lease(self, lease: int) -> None:
        # Every change of lease is told: keys put with the old one are gone, or about to be.
        if lease != self.__lease:
            self.__lease = lease
            for listener in self._lease_listeners:
                listener(lease)

    def add_lease_listener(self, listener: Callable[[int], None]) -> None:
        """Tell `listener` of every new lease this exporter holds (0: it holds none)."""
        self._lease_listeners.append(listener)

    def fence(self) -> list[Compare]:
        """The compare every leader-only transaction carries (empty when not leader)."""
        if not self._leading:
            return []
        return [Compare(self.key, "EQUAL", self.create_revision, target="CREATE")]

    def add_listener(self, listener: Callable[[bool], None]) -> None:
        """Tell `listener` of every change of leadership (True: this exporter became leader)."""
        self._listeners.append(listener)

    def _set(self, leader: bool, why: str) -> None:
        if leader != self._leading:
            self._leading = leader
            logger.info("{} leader ({}; key {} rev {})", "became" if leader else "is no longer", why, self.key, self.create_revision)
            for listener in self._listeners:
                listener(leader)

    async def run(self) -> None:
        """Campaign and keep the lease alive until stopped."""
        backoff = 0.2
        while not self._stopping:
            try:
                await self._step()
                backoff = 0.2
                await asyncio.sleep(self.ttl / 3 if self._leading else min(0.5, self.ttl / 4))
            except EtcdError as exc:
                if self._leading and time.monotonic() - self._last_renewed > self.ttl:
                    self._set(False, f"lease not renewed for {self.ttl}s: {exc}")
                    self._lease = 0
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _step(self) -> None:
        if self._lease:
            left = await self.etcd.lease_keepalive(self._lease)
            if left <= 0:
                self._lease = 0
                self._set(False, "lease expired")
            else:
                self._last_renewed = time.monotonic()
        if not self._lease:
            self._lease = await self.etcd.lease_grant(self.ttl)
            self._last_renewed = time.monotonic()
        if self._leading:
            current = await self.etcd.get(self.key)
            if current is None or current.create_revision != self.create_revision:
                self._set(False, "election key changed")
            return
        won = await self.etcd.txn(
            [Compare(self.key, "EQUAL", 0, target="CREATE")], [Op(self.key, self.identity, lease=self._lease)]
        )
        if won.succeeded:
            self.create_revision = won.revision
            self.leader = self.identity
            self._set(True, "won the election")
            return
        current = await self.etcd.get(self.key)
        self.leader = current.value if current else None

    async def resign(self) -> None:
        """Give up leadership at once (on shutdown): revoking the lease deletes the election key."""
        self._stopping = True
        if self._lease:
            try:
                await self.etcd.lease_revoke(self._lease)
            except EtcdError as exc:
                logger.warning("could not revoke the leader lease ({}); it expires in {}s", exc, self.ttl)
            self._lease = 0
        self._set(False, "shutting down")
