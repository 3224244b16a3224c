"""Intents: a request's changes from staging to their answer (the only code that settles a request)."""

from __future__ import annotations

import pytest

from exporter.errors import EtcdUnavailable, StaleRevisionError
from exporter.keys import IngressRef
from exporter.reconcile.intents import Intents, Outcome, answered
from exporter.store.records import RecordStore
from tests.helpers import AUTHORITY, record

UP = {"servers": [{"url": "http://10.0.0.5:8000"}]}
X, Y = IngressRef(AUTHORITY, "x"), IngressRef(AUTHORITY, "y")


async def test_a_staged_record_is_desired_until_answered_and_then_the_stores_which_the_mirror_writes() -> None:
    store = RecordStore()
    intents = Intents(store)
    wanted = record("x", revision=2, upstream=UP)
    staged = intents.stage([(X, wanted)])
    assert intents.desired(X) is wanted and intents.queued_requests == 1 and intents.queued_refs() == {X}
    taken = intents.take()
    assert taken == staged and intents.queued_requests == 0
    intents.resolve(taken, Outcome(done={X}))
    await answered(taken)
    # An answer never writes the store: the mirror does, once the watch delivered the commit.
    assert store.latest(X) is None and intents.desired(X) is None


async def test_a_request_refused_whole_fails_every_ingress_and_its_records_are_no_longer_desired() -> None:
    store = RecordStore()
    before = record("y", revision=1, upstream=UP)
    store.set(Y, before)
    intents = Intents(store)
    taken = intents.stage([(X, record("x", revision=2, upstream=UP)), (Y, record("y", revision=2, upstream=UP))])
    refusal = StaleRevisionError("stale", {"stored_revision": 3})
    intents.resolve(taken, Outcome(done={Y}, refused={taken[0].group: refusal}))
    with pytest.raises(StaleRevisionError):
        await answered(taken)
    # Refused whole: y was not taken into the store although its ingress was done through the outcome.
    assert store.latest(Y) is before and intents.desired(X) is None


async def test_an_intent_neither_done_nor_failed_was_not_written() -> None:
    intents = Intents(RecordStore())
    taken = intents.stage([(X, record("x", upstream=UP))])
    intents.resolve(taken, Outcome())
    with pytest.raises(EtcdUnavailable):
        await answered(taken)


async def test_a_newer_request_staged_meanwhile_stays_desired_when_an_older_one_fails() -> None:
    intents = Intents(RecordStore())
    older = intents.stage([(X, record("x", revision=2, upstream=UP))])
    newer_record = record("x", revision=3, upstream=UP)
    newer = intents.stage([(X, newer_record)])
    assert intents.calls([*older, *newer]) == {X: [(older[0].group, older[0].record), (newer[0].group, newer_record)]}
    intents.fail_all(older, EtcdUnavailable("down"))
    assert intents.desired(X) is newer_record
    intents.fail_queue(EtcdUnavailable("down"))
    assert intents.queued_requests == 0 and intents.desired(X) is None
    with pytest.raises(EtcdUnavailable):
        await answered(newer)
