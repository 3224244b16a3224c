"""The commit ledger: what each ingress's commits are, the parts in flight, records that wait for their keys."""

from __future__ import annotations

from exporter.etcd.types import WatchEvent
from exporter.keys import IngressRef, KeyLayout
from exporter.plan.plan import Change, UnitPlan
from exporter.reconcile.mirror import Mirror
from exporter.store.observed import Observed
from exporter.store.records import RecordStore
from exporter.write.ledger import CommitLedger
from exporter.write.writer import Writer
from tests.fake_etcd import FakeEtcd

LAYOUT = KeyLayout("traefik/worker_{authority}", "records")
REF = IngressRef("a", "x")
ROOT = LAYOUT.root("a")
RECORD = LAYOUT.record_key(REF)
RULE = f"{ROOT}/http/routers/a_x/rule"
URL = f"{ROOT}/http/services/a_x/loadBalancer/servers/000/url"


def unit(*keys: str, root: str = ROOT, keys_held: bool = False) -> UnitPlan:
    return UnitPlan("a/x", [Change(k, None, "v") for k in keys], [], owner=REF, record_key=RECORD, root=root, keys_held=keys_held)


class Book(CommitLedger):
    """A ledger whose commits the watch delivers to its mirror when told (`delivered`)."""

    def __init__(self) -> None:
        super().__init__(Observed(LAYOUT))
        etcd = FakeEtcd()
        self.mirror = Mirror(
            etcd, LAYOUT, self._observed, RecordStore(), Writer(etcd, self), self, on_drift=lambda _refs: None,
            on_stale=lambda _relist: None,
        )

    def delivered(self, revision: int) -> None:
        """The watch delivers our commit at `revision` (the event's content is taken from the commit)."""
        assert self.mirror.apply([WatchEvent.of("elsewhere", "v", revision)])


def ledger() -> Book:
    return Book()


async def test_a_record_committed_with_its_keys_is_ours_and_the_ingress_revision_once_the_watch_delivers_it() -> None:
    book = ledger()
    whole = unit(RECORD, RULE, URL)
    book.committed([whole], whole.changes, 10)
    # Until the watch delivers the commit, the mirror does not hold it and the ingress is not planned.
    assert book.record_revision(REF) == 0 and book.unseen(REF) == 10 and len(book.own) == 1
    book.delivered(10)
    assert book.record_revision(REF) == 10 and book.revision_of(REF) == 10 and book.unseen(REF) == 0
    assert book.mirror.summary().keys == 3 and len(book.own) == 0
    assert book.pending(REF) == 0


async def test_a_split_write_counts_its_parts_and_ends_at_its_last_one() -> None:
    book = ledger()
    whole = unit(RECORD, RULE, URL)
    book.started(whole, 2)
    book.committed([whole], whole.changes[:2], 10)
    book.delivered(10)
    assert book.pending(REF) == 1 and book.revision_of(REF) == 10
    book.committed([whole], whole.changes[2:], 11)
    book.delivered(11)
    assert book.pending(REF) == 0 and book.record_revision(REF) == 10 and book.revision_of(REF) == 11
    book.ended(whole)
    assert book.pending(REF) == 0


async def test_a_record_committed_alone_is_not_what_traefik_must_apply_and_awaits_its_keys() -> None:
    book = ledger()
    first = unit(RECORD, RULE)
    book.committed([first], first.changes, 10)
    alone = unit(RECORD, root="", keys_held=True)
    book.committed([alone], alone.changes, 12)
    book.delivered(10)
    book.delivered(12)
    assert book.record_revision(REF) == 12 and book.revision_of(REF) == 10 and book.awaits_keys(REF)
    keys = unit(URL)
    book.committed([keys], keys.changes, 13)
    book.delivered(13)
    assert not book.awaits_keys(REF) and book.revision_of(REF) == 13


async def test_keys_found_as_the_record_renders_end_the_wait() -> None:
    book = ledger()
    alone = unit(RECORD, root="", keys_held=True)
    book.committed([alone], alone.changes, 12)
    book.keys_written(REF)
    assert not book.awaits_keys(REF)


async def test_another_writers_change_of_the_keys_moves_the_revision_and_of_the_record_resets_it() -> None:
    book = ledger()
    whole = unit(RECORD, RULE)
    book.committed([whole], whole.changes, 10)
    book.delivered(10)
    book.observed(REF, 15, record=False)
    assert book.revision_of(REF) == 15
    book.observed(REF, 16, record=True)  # a peer's record: its keys come with it
    assert book.revision_of(REF) == 10  # nothing newer is mirrored here yet
