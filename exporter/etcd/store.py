"""`EtcdStore`: what the exporter's components need from etcd, and nothing more.

The client (`client.EtcdClient`, over gRPC or the JSON gateway) implements it against a real etcd; the tests'
in-memory fake implements it with revisions, compares, leases and watches, so the
reconciler's decisions can be tested fast and deterministically.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from .types import Compare, KeyValue, Op, RangePage, TxnResult, WatchEvent


class EtcdStore(Protocol):
    """Reads, guarded transactions, watches and leases (etcd v3 semantics)."""

    async def get(self, key: str) -> KeyValue | None:
        """One key, or None."""
        ...

    async def get_at(self, key: str, revision: int = 0) -> tuple[KeyValue | None, int]:
        """One key (or None) as it was at `revision` (the current one when 0), and the revision read."""
        ...

    async def range_prefix(self, prefix: str, *, revision: int = 0) -> RangePage:
        """Every key under `prefix`, consistent at one revision (the current one when 0)."""
        ...

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        """Apply `ops` atomically if every compare holds."""
        ...

    def watch_prefix(
        self, prefix: str, start_revision: int, idle_timeout: float, *, end: str | None = None
    ) -> AsyncIterator[list[WatchEvent]]:
        """Batches of events under `prefix` (with `end`: every key from `prefix` up to `end`, excluded) from
        `start_revision` on, one or more whole revisions each; raises EtcdError when the stream ends."""
        ...

    async def lease_grant(self, ttl: int) -> int:
        """A new lease of `ttl` seconds; returns its ID."""
        ...

    async def lease_keepalive(self, lease: int) -> int:
        """Refresh a lease; returns its remaining TTL (0: it expired)."""
        ...

    async def lease_revoke(self, lease: int) -> None:
        """Revoke a lease (its keys are deleted)."""
        ...
