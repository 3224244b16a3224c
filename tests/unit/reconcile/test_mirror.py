"""The mirror: etcd at one revision, changed only by a listing or by whole watch revisions applied in order."""

from __future__ import annotations

import hashlib

from exporter.etcd.types import Compare, WatchEvent
from exporter.keys import IngressRef, KeyLayout
from exporter.metrics import Metrics
from exporter.plan.plan import Change, UnitPlan
from exporter.reconcile.feed import watched_range
from exporter.reconcile.mirror import Mirror
from exporter.store.observed import Observed
from exporter.store.records import RecordStore
from exporter.supervisor import Supervisor
from exporter.write.ledger import CommitLedger
from exporter.write.writer import Writer
from tests.fake_etcd import FakeEtcd
from tests.helpers import AUTHORITY, eventually, record

LAYOUT = KeyLayout("traefik/worker_{authority}", "records")
REF = IngressRef(AUTHORITY, "x")
RULE = f"{LAYOUT.root(AUTHORITY)}/http/routers/{AUTHORITY}_x/rule"
UP = {"servers": [{"url": "http://10.0.0.5:8000"}]}


class World:
    """A mirror over an in-memory etcd, with the ingresses it reported as drifted and the listings it asked for."""

    def __init__(self, etcd: FakeEtcd | None = None, wait_timeout: float = 10.0) -> None:
        self.etcd = etcd if etcd is not None else FakeEtcd()
        self.observed, self.store = Observed(LAYOUT), RecordStore()
        self.ledger = CommitLedger(self.observed)
        self.drifted: list[IngressRef] = []
        self.relists: list[bool] = []
        self.metrics = Metrics()
        self.mirror = Mirror(
            self.etcd, LAYOUT, self.observed, self.store, Writer(self.etcd, self.ledger), self.ledger,
            on_drift=self.drifted.extend, on_stale=self.relists.append, wait_timeout=wait_timeout,
            supervisor=Supervisor(), metrics=self.metrics,
        )

    def relisted(self, reason: str) -> float:
        value = self.metrics.registry.get_sample_value("exporter_mirror_relists_total", {"reason": reason})
        return value or 0.0


def digest_of(etcd: FakeEtcd, revision: int) -> str:
    """What a range read of etcd at `revision` hashes to, by the digest's definition."""
    sha = hashlib.sha256()
    held = etcd._at(revision, lambda k: k.startswith((LAYOUT.roots_prefix, LAYOUT.records_dir)))
    for key in sorted(held, key=str.encode):
        stored = held[key]
        sha.update(key.encode() + b"\0" + stored.value.encode() + b"\0" + str(stored.mod_revision).encode() + b"\n")
    return sha.hexdigest()


async def test_a_listing_takes_every_key_and_record_at_one_revision_and_forgets_records_gone() -> None:
    world = World()
    world.store.set(IngressRef(AUTHORITY, "gone"), record("gone", upstream=UP))
    await world.etcd.put(RULE, "Host(`x.test`)")
    await world.etcd.put(LAYOUT.record_key(REF), record("x", upstream=UP).value)
    await world.mirror.relist("start")
    assert world.observed.get(RULE) == ("Host(`x.test`)", 2) and world.mirror.revision == world.etcd.revision
    assert list(world.store.records) == [REF] and world.relisted("start") == 1
    summary = world.mirror.summary()
    assert summary.keys == 2 and summary.prefixes == (LAYOUT.roots_prefix, LAYOUT.records_dir)


async def test_the_digest_is_the_one_a_range_read_of_etcd_at_the_same_revision_gives() -> None:
    world = World()
    await world.etcd.put(RULE, "Host(`x.test`)")
    await world.etcd.put(LAYOUT.record_key(REF), record("x", upstream=UP).value)
    await world.etcd.put("elsewhere/key", "not mirrored")
    await world.mirror.relist()
    at = world.mirror.revision
    assert world.mirror.summary().digest == digest_of(world.etcd, at)
    # Keys are hashed in ascending byte order: "records/" sorts before "traefik/".
    assert digest_of(world.etcd, at) != hashlib.sha256().hexdigest()
    await world.etcd.put(RULE, "Host(`y.test`)")
    assert world.mirror.apply([WatchEvent.of(RULE, "Host(`y.test`)", world.etcd.revision)])
    assert world.mirror.summary().digest == digest_of(world.etcd, world.etcd.revision)


async def test_another_writers_change_is_drift_and_our_commit_is_applied_from_what_we_wrote() -> None:
    world = World()
    await world.mirror.relist()
    ours = record("x", upstream=UP)
    unit = UnitPlan("x", [Change(LAYOUT.record_key(REF), None, ours.value), Change(RULE, None, "Host(`ours.test`)")], [],
                    owner=REF, record_key=LAYOUT.record_key(REF), record=ours, root=LAYOUT.root(AUTHORITY))
    world.ledger.committed([unit], unit.changes, 5)
    # The event's content is not read: our revision is applied from what we wrote, the record not decoded again.
    assert world.mirror.apply([WatchEvent.of(RULE, "unread", 5)])
    assert world.drifted == [] and world.observed.get(RULE) == ("Host(`ours.test`)", 5) and world.store.latest(REF) is ours
    assert world.mirror.apply([WatchEvent.of(RULE, "Host(`edited.test`)", 6)])
    assert world.drifted == [REF] and world.observed.get(RULE) == ("Host(`edited.test`)", 6) and world.mirror.revision == 6


async def test_a_peers_record_is_adopted_and_a_record_for_another_ingress_is_ignored() -> None:
    world = World()
    await world.mirror.relist()
    peer = record("x", revision=3, upstream=UP)
    world.mirror.apply([WatchEvent.of(LAYOUT.record_key(REF), peer.value, 4)])
    stored = world.store.latest(REF)
    assert stored is not None and stored.revision == 3 and world.drifted == [REF]
    misplaced = IngressRef(AUTHORITY, "y")
    world.mirror.apply([WatchEvent.of(LAYOUT.record_key(misplaced), peer.value, 5)])
    assert world.store.latest(misplaced) is None and world.mirror.revision == 5


async def test_a_revision_at_or_below_the_mirrors_asks_for_a_listing_and_changes_nothing() -> None:
    world = World()
    await world.mirror.relist()
    assert world.mirror.apply([WatchEvent.of(RULE, "Host(`a.test`)", 5), WatchEvent.of(RULE + "2", "b", 5)])
    # Revision 5 again (a revision split across messages) or an older one: the feed is broken.
    for revision in (5, 4):
        assert not world.mirror.apply([WatchEvent.of(RULE, "Host(`late.test`)", revision)])
        assert world.observed.get(RULE) == ("Host(`a.test`)", 5) and world.mirror.revision == 5
    assert world.relists == [True, True]
    await world.mirror.relist()
    assert world.relisted("out-of-order") == 1


async def test_keys_in_the_watched_range_outside_both_prefixes_are_dropped_and_the_revision_moves() -> None:
    world = World()
    await world.mirror.relist()
    low, high = watched_range(LAYOUT)
    assert (low, high) == (LAYOUT.records_dir, "traefik/worker`")
    between = "sidecar/leader"
    assert low <= between < high
    assert world.mirror.apply([WatchEvent.of(between, "x", 7)])
    assert world.observed.get(between) is None and world.mirror.revision == 7 and world.mirror.summary().keys == 0


async def test_the_watch_follows_etcd_and_a_listing_starts_a_generation_whose_watch_starts_right_after_it() -> None:
    world = World()
    world.mirror.start()
    await world.etcd.put(RULE, "Host(`a.test`)")
    await world.mirror.relist()
    listed = world.mirror.revision
    await eventually(lambda: _watches(world.etcd, 1))
    assert world.etcd.watch_starts == [(LAYOUT.records_dir, listed + 1)]
    at = await world.etcd.put(RULE, "Host(`b.test`)")
    await world.mirror.reached(at)
    assert world.observed.get(RULE) == ("Host(`b.test`)", at) and world.mirror.summary().digest == digest_of(world.etcd, at)
    await world.mirror.relist()
    await eventually(lambda: _watches(world.etcd, 2))
    assert world.etcd.watch_starts[1] == (LAYOUT.records_dir, at + 1) and world.mirror.feed.generation == 2
    await world.mirror.stop()


async def test_a_wait_the_watch_does_not_end_in_time_lists_again_and_counts_it() -> None:
    world = World(wait_timeout=0.2)
    world.mirror.start()
    await world.mirror.relist()
    await eventually(lambda: _watches(world.etcd, 1))
    world.etcd.watches_flowing.clear()  # a stalled stream
    at = await world.etcd.put(RULE, "Host(`a.test`)")
    await world.mirror.reached(at)
    assert world.mirror.revision >= at and world.relisted("stalled") == 1
    world.etcd.watches_flowing.set()
    await world.mirror.stop()


async def test_after_a_conflict_the_mirror_is_settled_once_it_shows_a_compared_key_changed() -> None:
    world = World(wait_timeout=5)
    world.mirror.start()
    await world.mirror.relist()
    record_key = LAYOUT.record_key(REF)
    unit = UnitPlan("x", [], [Compare(record_key, "EQUAL", 0)], owner=REF, record_key=record_key)
    # A peer created the record; then a key nobody watches moved etcd's revision past it: the
    # failed transaction's header names a revision the mirror may never reach through the watch.
    created = await world.etcd.put(record_key, record("x", upstream=UP).value)
    header = await world.etcd.put("zzz/unwatched", "x")
    await world.mirror.settled([unit], header, lambda: False)
    assert world.observed.get(record_key) is not None and world.mirror.revision == created < header
    assert world.relisted("conflict") == 0
    await world.mirror.stop()


async def _watches(etcd: FakeEtcd, count: int) -> bool:
    return len(etcd.watch_starts) == count
