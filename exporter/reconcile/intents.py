"""Requested record changes, from staging to their answer: the only code that settles a request.

A request (a push, an ingress file) is staged as one intent per ingress, all sharing a
`group`; its records are desired at once (`desired()` sees them before they commit), and
the request is answered when `resolve()` is given the outcome of the batch that carried it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import EtcdError, EtcdUnavailable, ExporterError, StaleRevisionError
from ..keys import IngressRef
from ..store.records import Record, RecordStore, supersedes

NOT_WRITTEN = "etcd is unreachable; nothing was written"


@dataclass(eq=False)
class Intent:
    """One ingress of a request: the record it asks for (a tombstone removes); `group` is the request."""

    ref: IngressRef
    record: Record
    group: int
    # What tracing took of the request when it was staged (tracing/hooks.py; None: untraced).
    trace: Any = None
    future: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass
class Outcome:
    """What a commit step achieved for the ingresses it was given.

    `done`: committed, or already as desired; `failed`: refused or not written, with the
    error the request gets; `refused`: requests refused whole (each of their ingresses gets
    that answer, whatever happened to the ingress through another request); `redo`: leader-only changes to plan again later (with the reason
    logged then); `error`: the etcd failure that cut the step short.
    """

    done: set[IngressRef] = field(default_factory=set)
    failed: dict[IngressRef, ExporterError] = field(default_factory=dict)
    refused: dict[int, ExporterError] = field(default_factory=dict)  # requests refused whole, by group
    redo: dict[IngressRef, str] = field(default_factory=dict)
    error: EtcdError | None = None
    # The newest revision a transaction of the step committed at: answered once the mirror holds it.
    revision: int = 0

    def open(self, refs: Iterable[IngressRef]) -> list[IngressRef]:
        """The refs among `refs` that are neither done nor failed."""
        return [r for r in refs if r not in self.done and r not in self.failed]


class Intents:
    """The queue of staged intents and the records they make desired."""

    def __init__(self, store: RecordStore) -> None:
        self._store = store
        self._queue: list[Intent] = []
        self._pending: dict[IngressRef, Record] = {}
        self._groups = itertools.count()
        self._queued_groups = 0  # requests with intents in the queue (each stages its intents at once)
        self.queued_at = 0.0

    def desired(self, ref: IngressRef) -> Record | None:
        """The newest accepted record of an ingress (pending or committed; a tombstone if removed)."""
        pending = self._pending.get(ref)
        return pending if pending is not None else self._store.latest(ref)

    def desired_view(self, tombstones_after: float) -> dict[IngressRef, Record]:
        """Every desired record; tombstones of removals before `tombstones_after` are left out (their record goes)."""
        view = dict(self._store.records)
        view.update({r: t for r, t in self._store.tombstones.items() if t.removed_at > tombstones_after})
        view.update(self._pending)
        return view

    def stage(self, changes: Iterable[tuple[IngressRef, Record]], trace: Any = None) -> list[Intent]:
        """Queue the changes of one request (already checked); returns its intents (`trace`: tracing's view of the request)."""
        group = next(self._groups)
        intents = [Intent(ref, record, group, trace) for ref, record in changes]
        for intent in intents:
            self._pending[intent.ref] = intent.record
        if not self._queue:
            self.queued_at = asyncio.get_running_loop().time()  # the loop's clock, as the write loop reads it
        self._queue.extend(intents)
        self._queued_groups += bool(intents)
        return intents

    @property
    def queued_requests(self) -> int:
        """How many requests are queued."""
        return self._queued_groups

    def queued_refs(self) -> set[IngressRef]:
        """The ingresses queued requests change."""
        return {i.ref for i in self._queue}

    def take(self) -> list[Intent]:
        """Every queued intent, in request order; the queue is empty afterwards."""
        intents, self._queue = self._queue, []
        self._queued_groups = 0
        return intents

    @staticmethod
    def calls(intents: Iterable[Intent]) -> dict[IngressRef, list[tuple[int, Record]]]:
        """Each ingress with every request that changes it, in order, and the record it asks for."""
        out: dict[IngressRef, list[tuple[int, Record]]] = {}
        for intent in intents:
            out.setdefault(intent.ref, []).append((intent.group, intent.record))
        return out

    def resolve(self, intents: Iterable[Intent], outcome: Outcome) -> None:
        """Answer each intent from `outcome`; one neither done nor failed was not written."""
        for intent in intents:
            if intent.future.done():
                continue
            if intent.group in outcome.refused:
                self._fail(intent, outcome.refused[intent.group])
            elif intent.ref in outcome.done:
                self._drop_pending(intent)
                intent.future.set_result(None)
            else:
                self._fail(intent, outcome.failed.get(intent.ref) or EtcdUnavailable(NOT_WRITTEN))

    def fail_all(self, intents: Iterable[Intent], error: ExporterError) -> None:
        """Answer every unanswered intent with `error` (nothing of it was written)."""
        for intent in intents:
            if not intent.future.done():
                self._fail(intent, error)

    def fail_queue(self, error: ExporterError) -> None:
        """Answer every queued intent with `error` and empty the queue."""
        self.fail_all(self.take(), error)

    def _fail(self, intent: Intent, error: ExporterError) -> None:
        self._drop_pending(intent)
        intent.future.set_exception(error)

    def _drop_pending(self, intent: Intent) -> None:
        if self._pending.get(intent.ref) is intent.record:
            del self._pending[intent.ref]


async def answered(intents: Sequence[Intent]) -> None:
    """Wait for every intent of a request; raise the first error any of them got."""
    if len(intents) == 1:
        # Most pushes carry one ingress: its future alone, without a gathering future (half the cost).
        await intents[0].future
        return
    results = await asyncio.gather(*(i.future for i in intents), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


def peer_verdict(wanted: Record, stored: Record | None) -> ExporterError | bool | None:
    """What a record a peer committed means for a request that wanted `wanted`.

    True: the peer wrote what the request asks, or a removal at least as new (it is done); an
    error: the request is stale against the peer's record by the revision rules (a removal
    may replace a live record of its own revision, an upsert never a removal of it); None:
    neither, plan it again.
    """
    if stored is None:
        return None
    if stored.removed and wanted.removed and stored.revision >= wanted.revision:
        return True
    if not wanted.removed and not stored.removed and wanted.content == stored.content:
        return True
    if not supersedes(wanted.revision, wanted.removed, stored):
        ref = wanted.key
        return StaleRevisionError(
            f"ingress {ref}: revision {stored.revision} was stored meanwhile",
            {"authority": ref.authority, "id": ref.id, "stored_revision": stored.revision},
        )
    return None
