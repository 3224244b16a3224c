"""`traefik served` spans: from a commit under a root to the check that saw Traefik serve it.

Each revision this daemon commits under a root waits here until the observer sees Traefik's
beacon for that root at that revision or later (every commit rewrites the beacon, and Traefik
applies a root all or nothing: traefik/observer.py). Its span is linked to every push whose
changes the commit carried; a push that waits to be served (`?wait=served`) is its parent,
so the push's trace ends with it. The observer checks every `poll_interval`: the span's end
is that late at most, and says so.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link
from opentelemetry.util.types import AttributeValue

from ..keys import IngressRef
from .batch import BatchRecord, Staged
from .hooks import TxnRecord

# Commits kept per root while Traefik has not served them (a Traefik that never applies must not grow this).
MAX_PENDING = 10_000
# Ingress names listed on one span; the count is always there.
_NAMED = 50


@dataclass(frozen=True, slots=True)
class _Commit:
    revision: int
    at_ns: int
    refs: tuple[IngressRef, ...]
    pushes: tuple[Staged, ...]
    paced: bool


class ServedSpans:
    """The commits of each root not yet seen served, and their spans once they are."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer
        self._pending: dict[str, list[_Commit]] = {}  # in revision order
        self._seen: dict[str, int] = {}
        # Pushes whose records committed while their keys were held (write/pacer.py): the commit
        # that writes the keys later, in another batch, carries their changes.
        self._held: dict[IngressRef, tuple[Staged, ...]] = {}

    def committed(self, txn: TxnRecord, batch: BatchRecord | None) -> None:
        """A transaction committed: each root it wrote under waits for Traefik at its revision."""
        if batch is not None:
            keyed = {ref for refs in txn.roots.values() for ref in refs}
            for ref in txn.refs:
                if ref not in keyed and (carried := batch.carried([ref])):
                    self._held.pop(ref, None)
                    self._held[ref] = tuple(carried)
                    if len(self._held) > MAX_PENDING:  # the oldest goes (its keys were never written: it was removed)
                        del self._held[next(iter(self._held))]
        for root, refs in txn.roots.items():
            pushes = tuple(batch.carried(refs)) if batch is not None else ()
            if self._held:
                pushes += tuple(push for ref in refs for push in self._held.pop(ref, ()))
            paced = batch is not None and root in batch.paced_roots
            commit = _Commit(txn.revision, txn.ended_ns, refs, pushes, paced)
            if self._seen.get(root, 0) >= txn.revision:
                self._emit(root, commit, time.time_ns(), 0.0)
                continue
            pending = self._pending.setdefault(root, [])
            # Replies of transactions in flight together may come out of order: kept in revision order.
            bisect.insort(pending, commit, key=_revision)
            if len(pending) > MAX_PENDING:
                del pending[0]

    def served(self, root: str, revision: int, poll_interval: float) -> None:
        """Traefik serves `root` at `revision`: every commit up to it was served by now."""
        self._seen[root] = max(self._seen.get(root, 0), revision)
        pending = self._pending.get(root, [])
        now, cut = time.time_ns(), bisect.bisect_right(pending, revision, key=_revision)
        for commit in pending[:cut]:
            self._emit(root, commit, now, poll_interval)
        del pending[:cut]

    def _emit(self, root: str, commit: _Commit, at_ns: int, poll_interval: float) -> None:
        names = sorted(str(ref) for ref in commit.refs)
        attributes: dict[str, AttributeValue] = {
            "exporter.root": root, "exporter.revision": commit.revision, "exporter.paced": commit.paced,
            "exporter.ingresses": len(names), "exporter.ingress_names": names[:_NAMED],
            "exporter.observer.poll_interval_s": poll_interval,
        }
        links = [Link(push.span) for push in commit.pushes]
        parents: list[trace.SpanContext | None] = [push.span for push in commit.pushes if push.waits] or [None]
        for parent in parents:
            context = trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent is not None else Context()
            span = self._tracer.start_span("traefik served", context, links=links, attributes=attributes, start_time=commit.at_ns)
            span.end(end_time=at_ns)



def _revision(commit: _Commit) -> int:
    return commit.revision
