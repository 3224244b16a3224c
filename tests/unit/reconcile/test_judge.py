"""The judge: pending records judged again at their plan against what peers committed meanwhile (pure)."""

from __future__ import annotations

from exporter.errors import StaleRevisionError
from exporter.keys import IngressRef
from exporter.reconcile.intents import Outcome
from exporter.reconcile.judge import Judge
from exporter.store.records import Record, RecordStore
from tests.helpers import AUTHORITY, record

UP = {"servers": [{"url": "http://10.0.0.5:8000"}]}
OTHER_UP = {"servers": [{"url": "http://10.0.0.9:8000"}]}
X, Y = IngressRef(AUTHORITY, "x"), IngressRef(AUTHORITY, "y")


class Batch:
    """A store of committed records and the requests of one batch."""

    def __init__(self) -> None:
        self.store = RecordStore()
        self.calls: dict[IngressRef, list[tuple[int, Record]]] = {}

    def request(self, call: int, *records: Record) -> None:
        for rec in records:
            self.calls.setdefault(rec.key, []).append((call, rec))

    def judge(self, *chunk: IngressRef) -> tuple[list[IngressRef], dict[IngressRef, Record], Outcome]:
        outcome = Outcome()
        judge = Judge(self.store)
        planned, records = judge.judge(list(chunk), dict.fromkeys(self.calls, 0), self.calls, outcome)
        return planned, records, outcome


def test_a_record_nobody_overtook_is_planned_as_it_is_pending() -> None:
    batch = Batch()
    batch.store.set(X, record("x", revision=1, upstream=UP))
    wanted = record("x", revision=2, upstream=UP)
    batch.request(1, wanted)
    planned, records, outcome = batch.judge(X)
    assert planned == [X] and records == {X: wanted} and outcome.refused == {} and outcome.done == set()


def test_a_request_a_peer_overtook_is_refused_and_its_ingress_not_planned() -> None:
    batch = Batch()
    batch.request(1, record("x", revision=2, upstream=UP))
    batch.store.set(X, record("x", revision=3, upstream=OTHER_UP))  # the peer's, seen meanwhile
    planned, _records, outcome = batch.judge(X)
    assert planned == []
    refused = outcome.refused[1]
    assert isinstance(refused, StaleRevisionError) and refused.data["stored_revision"] == 3
    assert outcome.failed[X] is refused


def test_what_a_peer_already_wrote_is_done_and_planned_from_what_etcd_holds() -> None:
    batch = Batch()
    wanted = record("x", revision=2, upstream=UP)
    batch.request(1, wanted)
    batch.store.set(X, record("x", revision=2, upstream=UP))  # the same content, committed by a peer
    planned, records, outcome = batch.judge(X)
    assert planned == [X] and X in outcome.done and X not in records  # planned from the committed record


def test_a_refused_request_is_refused_whole_and_another_request_for_its_ingress_is_written() -> None:
    # Request 1 = {x, y} turns stale through x; request 2 changes y alone: y is planned from request 2.
    batch = Batch()
    batch.request(1, record("x", revision=2, upstream=UP), record("y", revision=2, upstream=UP))
    mine = record("y", revision=3, upstream=OTHER_UP)
    batch.request(2, mine)
    batch.store.set(X, record("x", revision=5, upstream=UP))
    planned, records, outcome = batch.judge(X, Y)
    assert planned == [Y] and set(outcome.refused) == {1}
    assert records[Y] is mine


def test_when_the_only_request_for_an_ingress_is_refused_through_another_ingress_it_fails_too() -> None:
    batch = Batch()
    batch.request(1, record("x", revision=2, upstream=UP), record("y", revision=2, upstream=UP))
    batch.store.set(X, record("x", revision=5, upstream=UP))
    planned, _records, outcome = batch.judge(X, Y)
    assert planned == [] and outcome.failed[Y] is outcome.refused[1]
