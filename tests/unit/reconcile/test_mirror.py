"""The mirror: etcd read into the observed keys and the record store; our own commits told apart from others'."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from exporter.etcd.types import KeyValue, RangePage, WatchEvent
from exporter.keys import IngressRef, KeyLayout
from exporter.plan.plan import Change, UnitPlan
from exporter.reconcile.mirror import Mirror
from exporter.store.observed import Observed
from exporter.store.records import RecordStore
from exporter.write.ledger import CommitLedger
from exporter.write.writer import Writer
from tests.fake_etcd import FakeEtcd
from tests.helpers import AUTHORITY, eventually, record

LAYOUT = KeyLayout("traefik/worker_{authority}", "records")
REF = IngressRef(AUTHORITY, "x")
RULE = f"{LAYOUT.root(AUTHORITY)}/http/routers/{AUTHORITY}_x/rule"
UP = {"servers": [{"url": "http://10.0.0.5:8000"}]}


class World:
    """A mirror over an in-memory etcd, with the ingresses it reported as drifted."""

    def __init__(self, etcd: FakeEtcd | None = None) -> None:
        self.etcd = etcd if etcd is not None else FakeEtcd()
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


async def test_a_put_older_than_our_delete_does_not_bring_the_key_back_until_the_watches_pass_it() -> None:
    """A watch event deferred while our transactions were in flight arrives after our commit that deleted the key."""
    world = World()
    await world.mirror.relist()
    world.mirror.apply_events([WatchEvent.of(RULE, "Host(`x.test`)", 5)], roots=True)
    world.ledger.committed([], [Change(RULE, "Host(`x.test`)", None)], 9)
    # A peer's put at 7, older than our delete at 9, is delivered only now.
    world.mirror.apply_events([WatchEvent.of(RULE, "Host(`peer.test`)", 7)], roots=True)
    assert world.observed.get(RULE) is None and world.observed.newer(RULE, 8)
    # Once both watches are past 9, nothing older can arrive: the deletion is forgotten.
    world.mirror.apply_events([WatchEvent.of(RULE, None, 9)], roots=True)
    world.mirror.apply_events([WatchEvent.of(LAYOUT.record_key(IngressRef(AUTHORITY, "other")), None, 10)])
    assert not world.observed.newer(RULE, 8)
    world.mirror.apply_events([WatchEvent.of(RULE, "Host(`again.test`)", 11)], roots=True)
    assert world.observed.get(RULE) == ("Host(`again.test`)", 11)


async def test_a_reread_older_than_what_the_mirror_knows_changes_nothing_it_knows_newer() -> None:
    """A re-read sent before our commit and answered after it: its keys and its absences are older."""
    world = World()
    await world.mirror.relist()
    obj = RULE.rsplit("/", 1)[0]
    service = f"{LAYOUT.root(AUTHORITY)}/http/routers/{AUTHORITY}_x/service"
    world.mirror.apply_events([WatchEvent.of(RULE, "Host(`x.test`)", 5), WatchEvent.of(service, "x", 5)], roots=True)
    world.ledger.committed([], [Change(RULE, "Host(`x.test`)", None), Change(service, "x", "y")], 9)
    # Read at 6: the rule still there, the service at its old value, and a priority since deleted (at 8).
    priority = f"{obj}/priority"
    world.observed.replace_object(obj, [KeyValue(RULE, "Host(`x.test`)", 5, 5), KeyValue(service, "x", 5, 5),
                                        KeyValue(priority, "1", 6, 6)], 6)
    assert world.observed.get(RULE) is None and world.observed.get(service) == ("y", 9)
    assert world.observed.get(priority) == ("1", 6)  # nothing newer known of it: taken
    # A read at 12 that lacks the priority: it was deleted by 12.
    world.observed.replace_object(obj, [KeyValue(service, "y", 9, 5)], 12)
    assert world.observed.get(priority) is None and world.observed.get(service) == ("y", 9)


class HookAfterFirstRead(FakeEtcd):
    """An in-memory etcd that runs `hook` once, after answering the next range read."""

    hook: Callable[[], Awaitable[None]] | None = None

    async def range_prefix(self, prefix: str, *, revision: int = 0) -> RangePage:
        page = await super().range_prefix(prefix, revision=revision)
        hook, self.hook = self.hook, None
        if hook is not None:
            await hook()
        return page


async def test_a_reread_pinned_before_deletions_the_watches_delivered_meanwhile_does_not_bring_the_keys_back() -> None:
    """The first answer pins the re-read; a peer then replaces the server by the placeholder and both watches deliver it."""
    etcd = HookAfterFirstRead()
    world = World(etcd)
    router = RULE.rsplit("/", 1)[0]
    service = f"{LAYOUT.root(AUTHORITY)}/http/services/{AUTHORITY}_x/loadBalancer"
    url, placeholder = f"{service}/servers/000/url", f"{service}/passHostHeader"
    await etcd.put(url, "http://10.0.0.5:8000")
    await etcd.put(RULE, "Host(`x.test`)")
    await world.mirror.relist()

    other = LAYOUT.record_key(IngressRef(AUTHORITY, "other"))
    other_value = record("other", upstream=UP).value

    async def peer_writes() -> None:
        gone = await etcd.delete(url)
        put = await etcd.put(placeholder, "true")
        adopted = await etcd.put(other, other_value)
        world.mirror.apply_events([WatchEvent.of(url, None, gone), WatchEvent.of(placeholder, "true", put)], roots=True)
        world.mirror.apply_events([WatchEvent.of(other, other_value, adopted)])

    etcd.hook = peer_writes
    await world.mirror.refresh([UnitPlan(name="x", changes=[], compares=[], owner=REF, objects=(router, service))])
    assert world.observed.get(url) is None and world.observed.get(placeholder) == ("true", 5)
    # Once the re-read is in, the deletion is forgotten when the watches pass it again.
    world.mirror.apply_events([WatchEvent.of(RULE, "Host(`y.test`)", 7)], roots=True)
    world.mirror.apply_events([WatchEvent.of(other, None, 8)])
    assert not world.observed.newer(url, 3)


async def test_a_relist_drops_what_a_watch_delivered_meanwhile_and_the_watches_deliver_it_again() -> None:
    """A watch delivers a peer's delete while the re-list is out; the read, older, replaces the mirror."""
    etcd = HookAfterFirstRead()
    world = World(etcd)
    await etcd.put(RULE, "Host(`x.test`)")
    await world.mirror.relist()
    world.mirror.watches.start()
    try:

        async def peer_deletes_and_the_watch_delivers() -> None:
            await etcd.delete(RULE)
            await eventually(lambda: _absent(world.observed, RULE))

        etcd.hook = peer_deletes_and_the_watch_delivers
        await world.mirror.relist()
        assert world.observed.keys_seen == world.observed.revision == etcd.revision - 1  # the read's revision
        await eventually(lambda: _absent(world.observed, RULE))
        assert world.observed.keys_seen == etcd.revision
    finally:
        await world.mirror.stop()


async def _absent(observed: Observed, key: str) -> bool:
    return observed.get(key) is None
