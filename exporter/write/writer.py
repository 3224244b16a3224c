"""Apply plans to etcd: packed, compare-guarded transactions, several in flight.

Whole-unit transactions are independent (no ingress references another's objects), so they
may commit in any order, except that one needing a shared object another writes is sent after
it (write/packing.py). The chunks of an oversized unit commit strictly in order, each
guarded as the commit rule says (plan/guards.py: its record as the first chunk left it,
nothing under it changed since the previous chunk). The ledger is told of every committed transaction: the
mirror applies it when the watch delivers its revision.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from loguru import logger

from ..errors import EtcdError
from ..etcd.store import EtcdStore
from ..etcd.types import Compare, Op
from ..keys import IngressRef
from ..metrics import Metrics
from ..plan import guards
from ..plan.plan import Change, UnitPlan
from ..render.root_keys import beacon_value
from ..tracing.hooks import NO_TRACING, Tracing, TxnRecord
from .ledger import CommitLedger
from .packing import Txn, pack

# etcd's default limits (--max-txn-ops; below --max-request-bytes), until detected ones are set.
_ETCD_TXN_OPS = 128
_ETCD_REQUEST_BYTES = 1_000_000


@dataclass(slots=True)
class ApplyResult:
    """Which units committed, which lost a compare (re-plan them), and the etcd error if any.

    `revision`: the newest revision a transaction committed at; `conflict_revision`: the newest
    revision etcd evaluated a failed compare at (its reply's header).
    """

    committed: list[UnitPlan] = field(default_factory=list)
    conflicted: list[UnitPlan] = field(default_factory=list)
    failed: list[UnitPlan] = field(default_factory=list)
    error: EtcdError | None = None
    revision: int = 0
    conflict_revision: int = 0

    def merge(self, other: ApplyResult) -> None:
        """Add another apply's results to this one."""
        self.committed += other.committed
        self.conflicted += other.conflicted
        self.failed += other.failed
        self.error = self.error or other.error
        self.revision = max(self.revision, other.revision)
        self.conflict_revision = max(self.conflict_revision, other.conflict_revision)

    def answered(self, succeeded: bool, revision: int) -> None:
        """A transaction of this apply was answered at `revision`."""
        if succeeded:
            self.revision = max(self.revision, revision)
        else:
            self.conflict_revision = max(self.conflict_revision, revision)


class Writer:
    """Commits plans; `fence` compares (leadership) are added to every transaction.

    The watch waits, before it applies a message, until each of its revisions is known as ours
    (write/ledger.py) or every transaction in flight when it came is answered (`replies_in`).
    """

    def __init__(
        self, etcd: EtcdStore, ledger: CommitLedger, *, max_ops: int | None = None, max_bytes: int | None = None,
        max_in_flight: int = 8, metrics: Metrics | None = None, tracing: Tracing = NO_TRACING,
    ) -> None:
        """`max_ops`, `max_bytes`: etcd's limits per transaction (unset: etcd's defaults until `set_limits`);
        `tracing` is told of every transaction answered."""
        self._etcd = etcd
        self.tracing = tracing
        self.ledger = ledger
        self._metrics = metrics or Metrics()
        self._layout = ledger.layout
        # Beacon tokens: unique per writer and transaction, so a value read back names one commit.
        self._token_prefix = uuid.uuid4().hex[:8]
        self._sequence = 0
        self._max_ops = max_ops or _ETCD_TXN_OPS
        self._max_bytes = max_bytes or _ETCD_REQUEST_BYTES
        self._in_flight = asyncio.Semaphore(max_in_flight)
        # One event per transaction sent and not answered yet; `_answered` is set (and replaced) at each answer.
        self._flying: set[asyncio.Event] = set()
        self._answered = asyncio.Event()

    def set_limits(self, max_ops: int, max_bytes: int) -> None:
        """etcd's limits per transaction (detected once etcd answers)."""
        self._max_ops, self._max_bytes = max_ops, max_bytes

    async def replies_in(self, known: Callable[[], bool]) -> None:
        """Return once `known()` holds, or every transaction in flight now is answered (or failed): a
        revision committed before now is then ours only if a reply said so."""
        waiting = set(self._flying)
        while waiting & self._flying and not known():
            await self._answered.wait()

    async def apply(
        self, groups: Sequence[Sequence[UnitPlan]], fence: Sequence[Compare] = (), shared: Mapping[str, UnitPlan] | None = None
    ) -> ApplyResult:
        """Commit every unit of `groups`; a group (one request) shares a transaction when it fits.

        `shared`: the units of shared objects the groups' units may need (each written with the first that does).
        """
        budget = self._max_ops - len(fence)
        txns, split = pack(groups, budget, self._max_bytes, shared)
        result = ApplyResult()
        done = {id(t): asyncio.Event() for t in txns}
        jobs = [self._commit_whole(t, fence, result, done) for t in txns]
        jobs += [self._commit_chunks(chunks, fence, result, done) for chunks in split]
        await asyncio.gather(*jobs)
        return result

    def _beacons(self, txn: Txn) -> list[Change]:
        """The beacon puts of a transaction: a new token on every root it touches."""
        written = {c.key for c in txn.changes}
        self._sequence += 1
        token = f"{self._token_prefix}.{self._sequence}"
        return [
            Change(key, None, beacon_value(root, token))
            for root in sorted(txn.roots)
            if (key := self._layout.beacon_key(root)) not in written
        ]

    async def _send(self, txn: Txn, compares: Sequence[Compare], result: ApplyResult) -> tuple[bool, int]:
        async with self._in_flight:
            changes = txn.changes + self._beacons(txn)
            answered = asyncio.Event()
            self._flying.add(answered)
            started = time.time_ns() if self.tracing.enabled else 0
            try:
                reply = await self._etcd.txn(compares, [Op(c.key, c.new) for c in changes])
                if started:
                    self.tracing.txn(_traced(txn, len(changes), started, reply.succeeded, reply.revision))
                self._record(txn, changes, reply.succeeded, reply.revision)
                result.answered(reply.succeeded, reply.revision)
            finally:
                self._flying.discard(answered)
                answered.set()
                pulse, self._answered = self._answered, asyncio.Event()
                pulse.set()
        return reply.succeeded, reply.revision

    def _record(self, txn: Txn, changes: list[Change], succeeded: bool, revision: int) -> None:
        self._metrics.etcd_txns.labels("committed" if succeeded else "conflict").inc()
        if succeeded:
            self._metrics.keys_written.inc(len(txn.changes))
            self.ledger.committed(txn.units, changes, revision)
            names = sorted({u.name for u in txn.units})
            logger.bind(revision=revision, ingresses=names, ops=len(changes)).info(
                "txn rev={} ops={} units={}", revision, len(changes), ",".join(names)
            )

    async def _commit_whole(self, txn: Txn, fence: Sequence[Compare], result: ApplyResult, done: Mapping[int, asyncio.Event]) -> None:
        try:
            await _after(txn, done)
            ok, _revision = await self._send(txn, [*txn.compares, *txn.requires, *fence], result)
        except EtcdError as exc:
            self._metrics.etcd_errors.inc()
            result.error = exc
            result.failed.extend(txn.units)
            return
        finally:
            done[id(txn)].set()
        (result.committed if ok else result.conflicted).extend(txn.units)

    async def _commit_chunks(
        self, chunks: list[Txn], fence: Sequence[Compare], result: ApplyResult, done: Mapping[int, asyncio.Event]
    ) -> None:
        unit = chunks[0].units[0]
        compares = list(unit.compares)
        record_rev = guards.guarded_revision(unit)
        await _after(chunks[0], done)
        self.ledger.started(unit, len(chunks))
        try:
            for txn in chunks:
                try:
                    ok, revision = await self._send(txn, [*compares, *txn.requires, *fence], result)
                except EtcdError as exc:
                    self._metrics.etcd_errors.inc()
                    result.error = exc
                    result.failed.append(unit)
                    return
                if not ok:
                    result.conflicted.append(unit)
                    return
                if guards.carries_record(unit, txn.changes):
                    record_rev = revision
                compares = guards.next_part_guards(unit, record_rev)
            result.committed.append(unit)
        finally:
            self.ledger.ended(unit)


def _traced(txn: Txn, operations: int, started: int, succeeded: bool, revision: int) -> TxnRecord:
    """What tracing is told of one answered transaction: the ingresses it carried, by the root of their keys."""
    roots: dict[str, list[IngressRef]] = {root: [] for root in txn.roots}
    for unit in txn.units:
        if unit.root and unit.owner is not None:
            roots.setdefault(unit.root, []).append(unit.owner)
    refs = tuple(dict.fromkeys(u.owner for u in txn.units if u.owner is not None))
    return TxnRecord(started, time.time_ns(), succeeded, revision, operations, refs, {r: tuple(o) for r, o in roots.items()})


async def _after(txn: Txn, done: Mapping[int, asyncio.Event]) -> None:
    """Wait until the transactions writing the shared objects `txn` needs are done (committed or not)."""
    for earlier in txn.after:
        await done[id(earlier)].wait()
