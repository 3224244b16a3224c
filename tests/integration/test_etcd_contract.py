"""The in-memory etcd the unit tests run on, held to a real one: every case runs on each side.

The real side is an etcd of its own, started for this module with etcd's default limits (the
fake's defaults), so that revisions move only by what a case writes; the client speaks to it over
each transport (gRPC, the default, and the JSON gateway).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from exporter.embedded import EmbeddedEtcd, start_etcd
from exporter.errors import EtcdError
from exporter.etcd.client import EtcdClient
from exporter.etcd.store import EtcdStore
from exporter.etcd.types import Compare, Op, WatchEvent
from tests.fake_etcd import FakeEtcd
from tests.helpers import uid

# The fake runs as a unit test; the real etcd makes it an integration test.
SIDES = ["fake", *(pytest.param(t, marks=pytest.mark.integration) for t in ("grpc", "gateway"))]


@pytest.fixture(scope="module")
def own_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedEtcd]:
    server = start_etcd(Path(tmp_path_factory.mktemp("contract-etcd")))
    yield server
    server.stop()


@pytest.fixture(params=SIDES)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[EtcdStore]:
    if request.param == "fake":
        yield FakeEtcd()
        return
    client = EtcdClient([request.getfixturevalue("own_etcd").url], transport=request.param)
    yield client
    await client.close()


@pytest.fixture
def at() -> str:
    """A prefix of this case's own."""
    return f"contract/{uid()}/"


async def revision(store: EtcdStore, at: str) -> int:
    return (await store.range_prefix(at)).revision


async def test_a_transaction_that_writes_is_one_revision_and_keys_keep_their_create_revision(store: EtcdStore, at: str) -> None:
    before = await revision(store, at)
    first = await store.txn([], [Op(at + "a", "1"), Op(at + "b", "2")])
    assert first.succeeded and first.revision == before + 1
    second = await store.txn([], [Op(at + "a", "3")])
    assert second.revision == before + 2
    a, b = await store.get(at + "a"), await store.get(at + "b")
    assert a is not None and (a.value, a.mod_revision, a.create_revision) == ("3", before + 2, before + 1)
    assert b is not None and (b.mod_revision, b.create_revision) == (before + 1, before + 1)
    assert await store.get(at + "missing") is None


async def test_a_failed_compare_writes_nothing_and_answers_the_current_revision(store: EtcdStore, at: str) -> None:
    await store.txn([], [Op(at + "a", "1")])
    before = await revision(store, at)
    result = await store.txn([Compare(at + "a", "EQUAL", before + 5)], [Op(at + "b", "x"), Op(at + "a", None)])
    assert not result.succeeded and result.revision == before
    assert await store.get(at + "b") is None and await store.get(at + "a") is not None


async def test_a_missing_key_and_an_empty_range_compare_as_revision_0(store: EtcdStore, at: str) -> None:
    for compare in (
        Compare(at + "missing", "EQUAL", 0), Compare(at + "missing", "EQUAL", 0, target="CREATE"),
        Compare(at + "empty/", "EQUAL", 0, prefix=True), Compare(at + "empty/", "LESS", 1, prefix=True),
    ):
        assert (await store.txn([compare], [])).succeeded, compare
    assert not (await store.txn([Compare(at + "missing", "GREATER", 0)], [])).succeeded


async def test_a_presence_compare_holds_while_the_key_exists(store: EtcdStore, at: str) -> None:
    # What a transaction naming a shared object compares when it does not write it (write/packing.py).
    await store.txn([], [Op(at + "witness", "v")])
    assert (await store.txn([Compare(at + "witness", "GREATER", 0)], [Op(at + "router", "x")])).succeeded
    await store.txn([], [Op(at + "witness", None)])
    result = await store.txn([Compare(at + "witness", "GREATER", 0)], [Op(at + "router", "y")])
    router = await store.get(at + "router")
    assert not result.succeeded and router is not None and router.value == "x"


async def test_a_range_compare_holds_only_when_it_holds_for_every_key(store: EtcdStore, at: str) -> None:
    old = (await store.txn([], [Op(at + "r/1", "x")])).revision
    new = (await store.txn([], [Op(at + "r/2", "y")])).revision
    assert (await store.txn([Compare(at + "r/", "LESS", new + 1, prefix=True)], [])).succeeded
    assert not (await store.txn([Compare(at + "r/", "LESS", new, prefix=True)], [])).succeeded
    assert (await store.txn([Compare(at + "r/", "GREATER", old - 1, prefix=True)], [])).succeeded
    assert not (await store.txn([Compare(at + "r/", "EQUAL", new, prefix=True)], [])).succeeded


async def test_deleting_what_is_not_there_writes_no_revision(store: EtcdStore, at: str) -> None:
    before = await revision(store, at)
    result = await store.txn([], [Op(at + "missing", None)])
    assert result.succeeded and result.revision == before == await revision(store, at)


async def test_a_key_twice_in_one_transaction_is_refused_with_400(store: EtcdStore, at: str) -> None:
    before = await revision(store, at)
    with pytest.raises(EtcdError) as refused:
        await store.txn([], [Op(at + "a", "1"), Op(at + "a", "2")])
    assert refused.value.status == 400 and "duplicate key" in refused.value.title
    assert await revision(store, at) == before


@pytest.mark.parametrize("what", ["ops", "compares"])
async def test_more_than_128_operations_or_compares_are_refused_with_400(store: EtcdStore, at: str, what: str) -> None:
    ops = [Op(f"{at}k{n:03}", "v") for n in range(128)]
    assert (await store.txn([], ops)).succeeded  # etcd's default --max-txn-ops
    too_many = ([Compare(f"{at}k{n:03}", "GREATER", 0) for n in range(129)], []) if what == "compares" else ([], [*ops, Op(at + "x", "v")])
    with pytest.raises(EtcdError) as refused:
        await store.txn(*too_many)
    assert refused.value.status == 400 and "too many operations" in refused.value.title


async def test_a_prefix_lists_in_key_order_at_one_revision(store: EtcdStore, at: str) -> None:
    await store.txn([], [Op(at + "p/b", "2"), Op(at + "p/a", "1"), Op(at + "q", "3")])
    page = await store.range_prefix(at + "p/")
    assert [(kv.key, kv.value) for kv in page.kvs] == [(at + "p/a", "1"), (at + "p/b", "2")]
    assert page.revision == await revision(store, at)


async def test_a_read_pinned_to_an_older_revision_sees_the_keys_as_they_were_then(store: EtcdStore, at: str) -> None:
    put = (await store.txn([], [Op(at + "r/a", "1"), Op(at + "r/b", "2")])).revision
    await store.txn([], [Op(at + "r/a", None), Op(at + "r/b", "3"), Op(at + "r/c", "4")])
    then = await store.range_prefix(at + "r/", revision=put)
    assert then.revision == put
    assert [(kv.key[len(at):], kv.value, kv.mod_revision) for kv in then.kvs] == [("r/a", "1", put), ("r/b", "2", put)]
    found, read = await store.get_at(at + "r/a", put)
    assert read == put and found is not None and (found.value, found.mod_revision) == ("1", put)
    gone, now = await store.get_at(at + "r/a")
    assert gone is None and now == await revision(store, at)
    with pytest.raises(EtcdError) as future:
        await store.get_at(at + "r/a", now + 100)
    assert future.value.status == 400 and "future revision" in future.value.title


async def test_a_watch_replays_from_its_start_revision_in_order_each_revision_together(store: EtcdStore, at: str) -> None:
    first = (await store.txn([], [Op(at + "w/a", "1"), Op(at + "w/b", "2")])).revision
    await store.txn([], [Op(at + "other", "x")])
    await store.txn([], [Op(at + "w/a", None)])
    last = (await store.txn([], [Op(at + "w/b", "3")])).revision
    seen: list[list[WatchEvent]] = []
    async with asyncio.timeout(10):
        async for batch in store.watch_prefix(at + "w/", first, idle_timeout=30):
            seen.append(batch)
            if batch[-1].mod_revision >= last:
                break
    events = [(e.key[len(at):], e.value, e.deleted, e.mod_revision - first) for b in seen for e in b]
    assert events == [("w/a", "1", False, 0), ("w/b", "2", False, 0), ("w/a", None, True, 2), ("w/b", "3", False, 3)]
    # No revision is split across two batches.
    revisions = [e.mod_revision for b in seen for e in b]
    assert all(revisions.count(r) == sum(1 for e in b if e.mod_revision == r) for b in seen for r in {e.mod_revision for e in b})


async def test_a_watch_over_a_key_range_delivers_every_key_in_it_whole_revisions_in_order(store: EtcdStore, at: str) -> None:
    """The mirror's one watch covers the records prefix, the roots prefix and every key between them."""
    first = (await store.txn([], [Op(at + "a/1", "1"), Op(at + "b/1", "2"), Op(at + "c/1", "x")])).revision
    await store.txn([], [Op(at + "ab", "3")])
    await store.txn([], [Op(at + "0", "x")])
    last = (await store.txn([], [Op(at + "a/1", None), Op(at + "b/2", "4")])).revision
    seen: list[list[WatchEvent]] = []
    async with asyncio.timeout(10):
        async for batch in store.watch_prefix(at + "a/", first, idle_timeout=30, end=at + "b0"):
            seen.append(batch)
            if batch[-1].mod_revision >= last:
                break
    events = [(e.key[len(at):], e.value, e.mod_revision - first) for b in seen for e in b]
    assert events == [("a/1", "1", 0), ("b/1", "2", 0), ("ab", "3", 1), ("a/1", None, 3), ("b/2", "4", 3)]


async def test_a_watch_waiting_on_a_quiet_prefix_stops_as_soon_as_its_consumer_is_cancelled(store: EtcdStore, at: str) -> None:
    """A listing replaces the mirror's watch by cancelling it: the old one may not wait for an event first."""
    first = (await store.txn([], [Op(at + "q/a", "1")])).revision
    delivered = asyncio.Event()

    async def consume() -> None:
        async for _batch in store.watch_prefix(at + "q/", first, idle_timeout=30):
            delivered.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(delivered.wait(), 10)  # the stream is open, and now waits on a quiet prefix
    task.cancel()
    done, _ = await asyncio.wait((task,), timeout=5)
    assert done and task.cancelled()
    # The next watch on the same connection sees the next write.
    later = (await store.txn([], [Op(at + "q/b", "2")])).revision
    async with asyncio.timeout(10):
        async for batch in store.watch_prefix(at + "q/", later, idle_timeout=30):
            assert [(e.key, e.mod_revision) for e in batch] == [(at + "q/b", later)]
            break


async def test_a_revoked_lease_takes_its_keys_in_one_revision(store: EtcdStore, at: str) -> None:
    lease = await store.lease_grant(30)
    assert 0 < await store.lease_keepalive(lease) <= 30
    await store.txn([], [Op(at + "l/a", "1", lease=lease), Op(at + "l/b", "2", lease=lease), Op(at + "l/c", "3")])
    before = await revision(store, at)
    await store.lease_revoke(lease)
    assert await revision(store, at) == before + 1
    assert [kv.key for kv in (await store.range_prefix(at + "l/")).kvs] == [at + "l/c"]
    assert await store.lease_keepalive(lease) == 0
