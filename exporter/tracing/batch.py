"""What one batch recorded for its pushes' spans: when each push was staged, the plans and the transactions.

A batch is one span of a trace of its own, `write batch`, with its plans and transactions as
children, linked to every traced push it carried; each push's span links back to it. That is
the OpenTelemetry pattern for batched work: the batch's steps are made once, not copied into
every push's trace. A push's own span keeps its steps as events: `queued` (its validation
done), `batch taken` (the end of its wait) and `etcd Txn` for each transaction that carried
it, with its revision. Spans are made when the batch is over, with the times recorded here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import Event
from opentelemetry.trace import Link, SpanKind
from opentelemetry.util.types import AttributeValue

from ..keys import IngressRef
from .finished import FinishedSpans
from .hooks import TxnRecord

# Pushes a batch's span links to (the SDK's default link limit); `exporter.pushes` counts them all,
# and every push links to its batch.
MAX_LINKS = 128


@dataclass(frozen=True, slots=True, eq=False)
class Staged:
    """A push as its intents were queued: its span, whether it waits to be served, when it was queued,
    and the events and links its span gets from the batches that carry it (shared with the push)."""

    span: trace.SpanContext
    waits: bool
    at_ns: int
    events: list[Event] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PlanRecord:
    """One plan: from when to when, against the mirror at which revision, for which ingresses."""

    started_ns: int
    ended_ns: int
    revision: int
    refs: tuple[IngressRef, ...]


@dataclass
class BatchRecord:
    """The pushes of one batch, by ingress, and what the batch did for them."""

    taken_ns: int
    paced_roots: frozenset[str]
    span: trace.SpanContext | None = None  # the batch's own span, once it carries a traced push
    pushes: dict[IngressRef, list[Staged]] = field(default_factory=dict)
    plans: list[PlanRecord] = field(default_factory=list)
    txns: list[TxnRecord] = field(default_factory=list)

    @classmethod
    def of(cls, staged: Sequence[tuple[Any, IngressRef]], paced_roots: frozenset[str], spans: FinishedSpans) -> BatchRecord:
        """The record of a batch taken now: `staged` pairs each intent's push (None: untraced) with its ingress."""
        record = cls(time.time_ns(), paced_roots)
        for push, ref in staged:
            if isinstance(push, Staged):
                record.pushes.setdefault(ref, []).append(push)
        if record.pushes:
            record.span = spans.new_trace()
            taken, link = Event("batch taken", None, record.taken_ns), Link(record.span)
            for push in record.carried(list(record.pushes)):
                push.events.append(taken)
                push.links.append(link)
        return record

    def planned(self, started_ns: int, ended_ns: int, revision: int, refs: Sequence[IngressRef]) -> None:
        """A plan covered `refs` (kept only when a traced push asked for one of them)."""
        if self.pushes and any(ref in self.pushes for ref in refs):
            self.plans.append(PlanRecord(started_ns, ended_ns, revision, tuple(refs)))

    def answered(self, txn: TxnRecord) -> None:
        """A transaction was answered: kept, with an event on each push, when it carried a traced push's ingresses."""
        pushes = self.carried(txn.refs)
        if not pushes:
            return
        self.txns.append(txn)
        event = Event("etcd Txn", {"exporter.revision": txn.revision, "exporter.txn.succeeded": txn.succeeded}, txn.ended_ns)
        for push in pushes:
            push.events.append(event)

    def carried(self, refs: Sequence[IngressRef]) -> list[Staged]:
        """The pushes whose ingresses are among `refs`, each once."""
        out: dict[int, Staged] = {}
        for ref in refs:
            for push in self.pushes.get(ref, ()):
                out[id(push)] = push
        return list(out.values())

    def emit(self, spans: FinishedSpans) -> None:
        """The batch's span, linked to its pushes, and a child of it for every plan and transaction."""
        if self.span is None:
            return
        pushes = self.carried(list(self.pushes))
        spans.span(self.span, None, "write batch", self.taken_ns, time.time_ns(),
                   {"exporter.pushes": len(pushes), "exporter.ingresses": len(self.pushes)},
                   links=[Link(p.span) for p in pushes[:MAX_LINKS]])
        for plan in self.plans:
            attributes: dict[str, AttributeValue] = {"exporter.mirror.revision": plan.revision, "exporter.ingresses": len(plan.refs)}
            spans.child(self.span, "plan", plan.started_ns, plan.ended_ns, attributes)
        for txn in self.txns:
            attributes = {
                "db.system.name": "etcd", "db.operation.name": "Txn", "exporter.revision": txn.revision,
                "exporter.txn.operations": txn.operations, "exporter.txn.succeeded": txn.succeeded,
                "exporter.ingresses": len(txn.refs),
            }
            spans.child(self.span, "etcd Txn", txn.started_ns, txn.ended_ns, attributes, kind=SpanKind.CLIENT)
