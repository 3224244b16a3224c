"""What one batch recorded for its pushes' spans: when each push was staged, the plans and the transactions.

Spans are made when the batch is over, with the times recorded here: a plan or a transaction
serves every push whose ingresses it covered, and each of those pushes gets its own child
span of it, so a push's trace shows every step it went through, whatever it shared.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind
from opentelemetry.util.types import AttributeValue

from ..keys import IngressRef
from .finished import FinishedSpans
from .hooks import TxnRecord


@dataclass(frozen=True, slots=True, eq=False)
class Staged:
    """A push as its intents were queued: its span, whether it waits to be served, when it was queued."""

    span: trace.SpanContext
    waits: bool
    at_ns: int


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
    pushes: dict[IngressRef, list[Staged]] = field(default_factory=dict)
    plans: list[PlanRecord] = field(default_factory=list)
    txns: list[TxnRecord] = field(default_factory=list)

    @classmethod
    def of(cls, staged: Sequence[tuple[Any, IngressRef]], paced_roots: frozenset[str]) -> BatchRecord:
        """The record of a batch taken now: `staged` pairs each intent's push (None: untraced) with its ingress."""
        record = cls(time.time_ns(), paced_roots)
        for push, ref in staged:
            if isinstance(push, Staged):
                record.pushes.setdefault(ref, []).append(push)
        return record

    def planned(self, started_ns: int, ended_ns: int, revision: int, refs: Sequence[IngressRef]) -> None:
        """A plan covered `refs` (kept only when a traced push asked for one of them)."""
        if self.pushes and any(ref in self.pushes for ref in refs):
            self.plans.append(PlanRecord(started_ns, ended_ns, revision, tuple(refs)))

    def carried(self, refs: Sequence[IngressRef]) -> list[Staged]:
        """The pushes whose ingresses are among `refs`, each once."""
        out: dict[int, Staged] = {}
        for ref in refs:
            for push in self.pushes.get(ref, ()):
                out[id(push)] = push
        return list(out.values())

    def emit(self, spans: FinishedSpans) -> None:
        """Each push's wait in the batch, and a child span of every plan and transaction that covered it."""
        if not self.pushes:
            return
        for push in self.carried(list(self.pushes)):
            spans.child(push.span, "batch wait", push.at_ns, self.taken_ns)
        for plan in self.plans:
            attributes: dict[str, AttributeValue] = {"exporter.mirror.revision": plan.revision, "exporter.ingresses": len(plan.refs)}
            for push in self.carried(plan.refs):
                spans.child(push.span, "plan", plan.started_ns, plan.ended_ns, attributes)
        for txn in self.txns:
            attributes = {
                "db.system.name": "etcd", "db.operation.name": "Txn", "exporter.revision": txn.revision,
                "exporter.txn.operations": txn.operations, "exporter.txn.succeeded": txn.succeeded,
                "exporter.ingresses": len(txn.refs),
            }
            for push in self.carried(txn.refs):
                spans.child(push.span, "etcd Txn", txn.started_ns, txn.ended_ns, attributes, kind=SpanKind.CLIENT)
