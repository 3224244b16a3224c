"""The mirror: etcd read into the observed keys and the record store; our own commits told apart from others'."""

from __future__ import annotations

from exporter.etcd.types import WatchEvent
from exporter.keys import IngressRef, KeyLayout
from exporter.reconcile.mirror import Mirror
from exporter.store.observed import Observed
from exporter.store.records import RecordStore
from exporter.write.ledger import CommitLedger
from exporter.write.writer import Writer
from tests.fake_etcd import FakeEtcd
from tests.helpers import AUTHORITY, record

LAYOUT = KeyLayout("traefik/worker_{authority}", "records")
REF = IngressRef(AUTHORITY, "x")
RULE = f"{LAYOUT.root(AUTHORITY)}/http/routers/{AUTHORITY}_x/rule"
UP = {"servers": [{"url": "http://10.0.0.5:8000"}]}


class World:
    """A mirror over an in-memory etcd, with the ingresses it reported as drifted."""

    def __init__(self) -> None:
        self.etcd = FakeEtcd()
        self.observed, self.store = Observed(LAYOUT), RecordStore()
        self.ledger = CommitLedger(self.observed)
        self.drifted: list[IngressRef] = []
        self.mirror = Mirror(
            self.etcd, LAYOUT, self.observed, self.store, Writer(self.etcd, self.ledger), self.ledger,
            on_drift=self.drifted.extend, on_stale=lambda _relist: None,
        )


async def test_a_relist_takes_every_key_and_record_and_forgets_records_gone_meanwhile() -> None:
    world = World()
    world.store.set(IngressRef(AUTHORITY, "gone"), record("gone", upstream=UP))
    await world.etcd.put(RULE, "Host(`x.test`)")
    await world.etcd.put(LAYOUT.record_key(REF), record("x", upstream=UP).value)
    await world.mirror.relist()
    assert world.observed.get(RULE) == ("Host(`x.test`)", 2) and world.observed.revision == world.etcd.revision
    assert list(world.store.records) == [REF]


async def test_another_writers_change_of_an_owned_key_is_drift_and_ours_is_not() -> None:
    world = World()
    await world.mirror.relist()
    world.observed.own.add(5)
    world.mirror.apply_events([WatchEvent.of(RULE, "Host(`ours.test`)", 5)], roots=True)
    assert world.drifted == [] and world.observed.get(RULE) is None  # ours: the reply already told the mirror
    world.mirror.apply_events([WatchEvent.of(RULE, "Host(`edited.test`)", 6)], roots=True)
    assert world.drifted == [REF] and world.observed.get(RULE) == ("Host(`edited.test`)", 6)
    assert world.observed.keys_seen == 6


async def test_a_peers_record_is_adopted_and_a_record_for_another_ingress_is_ignored() -> None:
    world = World()
    await world.mirror.relist()
    peer = record("x", revision=3, upstream=UP)
    world.mirror.apply_events([WatchEvent.of(LAYOUT.record_key(REF), peer.value, 4)])
    stored = world.store.latest(REF)
    assert stored is not None and stored.revision == 3 and world.drifted == [REF]
    # A record whose key names one ingress and whose content holds another is not taken.
    misplaced = IngressRef(AUTHORITY, "y")
    world.mirror.apply_events([WatchEvent.of(LAYOUT.record_key(misplaced), peer.value, 5)])
    assert world.store.latest(misplaced) is None
