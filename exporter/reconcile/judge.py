"""Pending records judged again when they are planned (pure: records in, a decision out).

A request is checked against the newest record when it arrives, but a peer may commit a newer
one (seen through the watch, or re-read after a conflict) before the request is planned: the
plan's record guard would then compare against the peer's record and pass, and the older
request would win. So every record still pending is judged again by the revision rules in the
same step as its plan:
- written by the peer already (or a removal at least as new): the request is done, and the
  ingress is planned from what etcd holds;
- overtaken: the request is refused, all of it (a request is all or nothing): none of its
  ingresses is planned from it. Another request of the batch that changes one of them is
  still written, from its own record; refusing a request can leave an ingress's earlier
  request as the one to write, which is judged in turn.
A batch writes the records of its own requests only, even when a newer request for the same
ingress was queued meanwhile (during a retry): the store takes the batch's records when it is
answered, so writing the queued one would leave etcd ahead of the store. An ingress planned
for no request of the batch (a drift repair, held keys) is planned from its committed record,
never from a queued request's: that request may yet be refused as a whole, and etcd would
then hold part of a request answered 409.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import ExporterError
from ..keys import IngressRef
from ..store.records import Record, RecordStore
from .intents import Outcome, peer_verdict

Calls = Mapping[IngressRef, Sequence[tuple[int, Record]]]


class Judge:
    """Decides, for one step of a batch, which ingresses are planned and from which record."""

    def __init__(self, store: RecordStore) -> None:
        self._store = store

    def judge(
        self, chunk: Sequence[IngressRef], requested: Mapping[IngressRef, int], calls: Calls, outcome: Outcome
    ) -> tuple[list[IngressRef], dict[IngressRef, Record]]:
        """The ingresses of `chunk` to plan, and the record to plan where it is not the committed one.

        `calls` lists, per ingress, the requests of the batch that change it (request, record) in
        order; refused requests go into `outcome.refused`, done ingresses into `outcome.done`.
        """
        changed = True
        while changed:  # a refusal can make an ingress's earlier record the one to judge
            changed = False
            for ref in chunk:
                planned, record = self._record(ref, requested, calls, outcome)
                verdict = self._verdict(record) if planned and ref in requested else None
                if isinstance(verdict, ExporterError):
                    for call, _ in calls.get(ref, ()):
                        if call not in outcome.refused:
                            outcome.refused[call] = verdict
                            changed = True
        out, records = [], {}
        for ref in chunk:
            planned, record = self._record(ref, requested, calls, outcome)
            if not planned:
                outcome.failed[ref] = outcome.refused[calls[ref][-1][0]]
                continue
            verdict = self._verdict(record)
            if isinstance(verdict, ExporterError):
                continue  # a pending record of a request not in this batch, overtaken: its batch answers it
            if verdict is True:
                # etcd holds what was asked, or a removal newer than the one asked: plan from that,
                # never the pending record (an older tombstone would go back over the newer one).
                if ref in requested:
                    outcome.done.add(ref)
                record = self._store.latest(ref)
            if record is not None and record is not self._store.latest(ref):
                records[ref] = record
            out.append(ref)
        return out, records

    def _record(self, ref: IngressRef, requested: Mapping[IngressRef, int], calls: Calls, outcome: Outcome) -> tuple[bool, Record | None]:
        """(planned at all, the record to plan): for a requested ingress the newest of this batch's
        requests not refused, never one of a request queued after the batch was taken (a retry
        re-plans while new requests arrive: that request is judged, and answered, in its own
        batch); for any other its committed record."""
        mine = calls.get(ref, ()) if ref in requested else ()
        if not mine:
            return True, self._store.latest(ref)
        left = [record for call, record in mine if call not in outcome.refused]
        return (True, left[-1]) if left else (False, None)

    def _verdict(self, record: Record | None) -> ExporterError | bool | None:
        if record is None:
            return None
        stored = self._store.latest(record.key)
        return None if record is stored else peer_verdict(record, stored)
