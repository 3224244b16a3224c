"""The one revision order: `supersedes`, and every rule that decides by it agreeing with it."""

from __future__ import annotations

import itertools

import pytest

from exporter.errors import StaleRevisionError
from exporter.reconcile.intents import peer_verdict
from exporter.store.records import Record, RecordStore, supersedes
from exporter.store.revisions import classify_remove, classify_upsert
from tests.helpers import AUTHORITY, record

UP = {"servers": [{"url": "http://10.0.0.5:8000"}]}


def at(revision: int, removed: bool, path: str = "/") -> Record:
    live = record("rev", revision=revision, upstream=UP, path_prefix=path)
    return live.removal(revision, 1.0) if removed else live


CASES = list(itertools.product([1, 2, 3], [False, True], [1, 2, 3], [False, True]))


def test_a_newer_revision_wins_and_a_removal_wins_a_tie_with_a_live_record() -> None:
    assert supersedes(3, False, at(2, True)) and not supersedes(2, False, at(2, True))
    assert supersedes(2, True, at(2, False)) and not supersedes(2, False, at(2, False))
    assert not supersedes(2, True, at(2, True)) and not supersedes(1, True, at(2, False))


@pytest.mark.parametrize(("revision", "removed", "other", "other_removed"), CASES)
def test_requests_peers_and_the_store_follow_the_one_order(revision: int, removed: bool, other: int, other_removed: bool) -> None:
    stored, change = at(other, other_removed), at(revision, removed, path="/new")
    wins = supersedes(revision, removed, stored)
    verdict: str
    # A request: applied when it wins (a removal of what is gone already is a no-op), refused otherwise.
    if removed:
        try:
            verdict = classify_remove(stored, AUTHORITY, "rev", revision)
        except StaleRevisionError:
            verdict = "stale"
        assert verdict == ("noop" if other_removed else "apply" if wins else "stale")
    else:
        try:
            verdict = classify_upsert(stored, change)
        except StaleRevisionError:
            verdict = "stale"
        assert verdict == ("apply" if wins else "stale")
    # A peer's record met at the plan: a request it does not supersede goes on.
    met = peer_verdict(change, stored)
    if not (removed and other_removed and other >= revision):
        assert isinstance(met, StaleRevisionError) == (not wins)
    # Our own commit is kept in the store unless what the watch brought supersedes it.
    store = RecordStore()
    store.set(stored.key, stored)
    store.committed(change.key, change)
    assert store.latest(change.key) is (stored if supersedes(other, other_removed, change) else change)
