"""An in-memory etcd (`EtcdStore`) for fast, deterministic tests of the reconciler's decisions,
held to a real etcd by tests/integration/test_etcd_contract.py (the same cases on both).

It keeps etcd's semantics where the exporter relies on them: one revision per transaction
that writes, mod/create revisions, compares on single keys and on ranges (an empty range
compares as a key at revision 0), leases whose revocation deletes their keys, watches that
replay history from a start revision, and compaction. `down` makes every call fail as an
unreachable etcd; `before_txn` runs a hook (a peer's write) before a transaction is applied;
`max_txn_ops` bounds operations and, separately, compares (400), a key twice among one
transaction's operations is refused (400), and a request larger than the
gRPC bound of etcd's default `--max-request-bytes` is refused as etcd's gateway does (429);
`watches_flowing` cleared holds every watch stream back; `hold(prefix)` holds back only the
watches on one prefix (one watch lagging another) until `release(prefix)`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from exporter.errors import EtcdError, WatchCanceled
from exporter.etcd.types import Compare, KeyValue, Op, RangePage, TxnResult, WatchEvent


@dataclass
class _Stored:
    value: str
    create_revision: int
    mod_revision: int
    lease: int = 0


class FakeEtcd:
    """One etcd member in memory."""

    def __init__(self, max_txn_ops: int = 128, max_request_bytes: int = 1536 * 1024) -> None:
        self.max_txn_ops = max_txn_ops
        self.grpc_max = max_request_bytes + 512 * 1024
        self.revision = 1
        self.compacted = 0
        self.down = False
        self.txns: list[tuple[list[Compare], list[Op], bool]] = []
        self.before_txn: Callable[[Sequence[Compare], Sequence[Op]], Awaitable[None]] | None = None
        # (prefix, start revision) of every watch created; per prefix, the newest revision a watch handed over
        self.watch_starts: list[tuple[str, int]] = []
        self.delivered: dict[str, int] = {}
        # Cleared, watches hand over nothing (a slow watch stream)
        self.watches_flowing = asyncio.Event()
        self.watches_flowing.set()
        self._held: dict[str, asyncio.Event] = {}
        self._kv: dict[str, _Stored] = {}
        self._history: list[tuple[int, str, str | None]] = []
        # (revision, key, what the key held before it): reads at an older revision undo these.
        self._undo: list[tuple[int, str, _Stored | None]] = []
        self._leases: dict[int, int] = {}
        self._next_lease = 1000
        self._changed = asyncio.Condition()

    # ----- EtcdStore

    async def get(self, key: str) -> KeyValue | None:
        self._check()
        stored = self._kv.get(key)
        return None if stored is None else KeyValue(key, stored.value, stored.mod_revision, stored.create_revision)

    async def get_at(self, key: str, revision: int = 0) -> tuple[KeyValue | None, int]:
        self._check()
        revision = revision or self.revision
        stored = self._at(revision, lambda k: k == key).get(key)
        return (None if stored is None else KeyValue(key, stored.value, stored.mod_revision, stored.create_revision)), revision

    async def range_prefix(self, prefix: str, *, revision: int = 0) -> RangePage:
        self._check()
        revision = revision or self.revision
        found = self._at(revision, lambda k: k.startswith(prefix))
        kvs = [KeyValue(k, s.value, s.mod_revision, s.create_revision) for k, s in sorted(found.items())]
        return RangePage(kvs, revision)

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        self._check()
        if len(compares) > self.max_txn_ops or len(ops) > self.max_txn_ops:
            raise EtcdError("etcd answered HTTP 400: etcdserver: too many operations in txn request", status=400)
        if len({op.key for op in ops}) < len(ops):
            raise EtcdError("etcd answered HTTP 400: etcdserver: duplicate key given in txn request", status=400)
        size = sum(len(c.key) + 16 for c in compares) + sum(len(o.key) + len(o.value or "") + 16 for o in ops)
        if size > self.grpc_max:
            raise EtcdError(f"etcd answered HTTP 429: grpc: received message larger than max ({size} vs. {self.grpc_max})", status=429)
        if self.before_txn is not None:
            hook, self.before_txn = self.before_txn, None
            await hook(compares, ops)
        succeeded = all(self._holds(c) for c in compares)
        self.txns.append((list(compares), list(ops), succeeded))
        if succeeded:
            await self._write(ops)
        return TxnResult(succeeded, self.revision)

    async def watch_prefix(
        self, prefix: str, start_revision: int, idle_timeout: float, *, end: str | None = None
    ) -> AsyncIterator[list[WatchEvent]]:
        self._check()
        wanted: Callable[[str], bool] = (lambda k: prefix <= k < end) if end is not None else (lambda k: k.startswith(prefix))
        self.watch_starts.append((prefix, start_revision))
        if start_revision <= self.compacted:
            raise WatchCanceled("required revision has been compacted", self.compacted)
        sent = start_revision - 1
        while True:
            upto = self.revision
            batches: dict[int, list[WatchEvent]] = {}
            for rev, key, value in self._history:
                if sent < rev <= upto and wanted(key):
                    batches.setdefault(rev, []).append(WatchEvent.of(key, value, rev))
            for rev in sorted(batches):
                await self.watches_flowing.wait()
                if (held := self._held.get(prefix)) is not None:
                    await held.wait()
                yield batches[rev]
                self.delivered[prefix] = rev
            sent = max(sent, upto)
            async with self._changed:
                if self.revision == sent and not self.down:
                    await self._changed.wait()
            self._check()

    def hold(self, prefix: str) -> None:
        """Hold back what the watches on `prefix` would hand over next."""
        self._held.setdefault(prefix, asyncio.Event())

    def release(self, prefix: str) -> None:
        """Let the watches on `prefix` hand over what they hold."""
        self._held.pop(prefix).set()

    async def lease_grant(self, ttl: int) -> int:
        self._check()
        self._next_lease += 1
        self._leases[self._next_lease] = ttl
        return self._next_lease

    async def lease_keepalive(self, lease: int) -> int:
        self._check()
        return self._leases.get(lease, 0)

    async def lease_revoke(self, lease: int) -> None:
        self._check()
        await self.expire(lease)

    # ----- test controls

    async def put(self, key: str, value: str) -> int:
        """An unguarded put (another writer)."""
        await self._write([Op(key, value)])
        return self.revision

    async def delete(self, key: str) -> int:
        """An unguarded delete (another writer)."""
        await self._write([Op(key, None)])
        return self.revision

    async def expire(self, lease: int) -> None:
        """The lease ends: its keys are deleted in one revision."""
        self._leases.pop(lease, None)
        await self._write([Op(k, None) for k, s in self._kv.items() if s.lease == lease])

    def compact(self) -> None:
        """Drop the history up to now (watches from before fail with WatchCanceled)."""
        self.compacted = self.revision
        self._history = []
        self._undo = []

    async def set_down(self, down: bool) -> None:
        """Make etcd unreachable (or reachable again); open watches break."""
        self.down = down
        async with self._changed:
            self._changed.notify_all()

    def value(self, key: str) -> str | None:
        """The current value of a key."""
        stored = self._kv.get(key)
        return None if stored is None else stored.value

    def history(self) -> list[tuple[int, str, str | None]]:
        """Every key change since the last compaction, in order: (revision, key, value; None for a delete)."""
        return list(self._history)

    def set_create_revision(self, key: str, revision: int) -> None:
        """Pretend `key` was created at `revision` (a fence compare names one)."""
        self._kv[key].create_revision = revision

    def keys(self, prefix: str = "") -> dict[str, str]:
        """Every key under `prefix` with its value."""
        return {k: s.value for k, s in sorted(self._kv.items()) if k.startswith(prefix)}

    # ----- internals

    def _at(self, revision: int, wanted: Callable[[str], bool]) -> dict[str, _Stored]:
        """The `wanted` keys as they were at `revision` (etcd refuses a revision compacted away, or one not written yet)."""
        if revision > self.revision:
            raise EtcdError("etcd answered HTTP 400: etcdserver: mvcc: required revision is a future revision", status=400)
        if revision < self.compacted:
            raise EtcdError("etcd answered HTTP 400: etcdserver: mvcc: required revision has been compacted", status=400)
        found = {k: s for k, s in self._kv.items() if wanted(k)}
        for rev, key, before in reversed(self._undo):
            if rev <= revision:
                break
            if wanted(key):
                if before is None:
                    found.pop(key, None)
                else:
                    found[key] = before
        return found

    def _check(self) -> None:
        if self.down:
            raise EtcdError("etcd at fake:2379 unreachable: ConnectionRefusedError", unavailable=True)

    def _holds(self, compare: Compare) -> bool:
        if compare.prefix:
            found = [s for k, s in self._kv.items() if k.startswith(compare.key)]
        else:
            found = [self._kv[compare.key]] if compare.key in self._kv else []
        revisions = [s.create_revision if compare.target == "CREATE" else s.mod_revision for s in found] or [0]
        return all(_compare(rev, compare.result, compare.mod_revision) for rev in revisions)

    async def _write(self, ops: Sequence[Op]) -> None:
        changes = [op for op in ops if op.value is not None or op.key in self._kv]
        if not changes:
            return
        self.revision += 1
        for op in changes:
            self._undo.append((self.revision, op.key, self._kv.get(op.key)))
            if op.value is None:
                del self._kv[op.key]
            else:
                old = self._kv.get(op.key)
                created = old.create_revision if old is not None else self.revision
                self._kv[op.key] = _Stored(op.value, created, self.revision, op.lease)
            self._history.append((self.revision, op.key, op.value))
        async with self._changed:
            self._changed.notify_all()


def _compare(actual: int, result: str, expected: int) -> bool:
    if result == "EQUAL":
        return actual == expected
    if result == "NOT_EQUAL":
        return actual != expected
    if result == "LESS":
        return actual < expected
    return actual > expected
