"""Request batches in flight together under sustained load, on the in-memory etcd.

Closed-loop clients (each pushes again once answered) keep the write loop busy; the loop
then commits up to `batches_in_flight` batches at once, never two writing one ingress, and
what other writers change meanwhile still reaches the mirror within a round trip.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from exporter.etcd.types import Compare, Op, TxnResult
from exporter.keys import IngressRef
from exporter.reconcile import Reconciler
from tests.fake_etcd import FakeEtcd
from tests.helpers import AUTHORITY, eventually, record, uid
from tests.test_reconcile_fake import FENCE, LAYOUT, UP, Leader, elected_etcd, rule_key, running

CLIENTS = 16  # one batch of their updates fits one transaction


class SlowEtcd(FakeEtcd):
    """The in-memory etcd with a round trip, counting the request transactions in flight (unfenced: the leader's own
    writes of a batch go beside them) and the ingresses each writes."""

    def __init__(self, round_trip: float) -> None:
        super().__init__()
        self.round_trip = round_trip
        self.flying = 0
        self.most_flying = 0
        self._writing: list[set[str]] = []
        self.shared: list[set[str]] = []  # ingresses two transactions in flight wrote at once

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        records = {op.key for op in ops if op.key.startswith(LAYOUT.records_dir)}
        self.shared += [records & other for other in self._writing if records & other]
        self._writing.append(records)
        requests = FENCE not in compares
        self.flying += requests
        self.most_flying = max(self.most_flying, self.flying)
        try:
            await asyncio.sleep(self.round_trip)  # the network and etcd's own work
            return await super().txn(compares, ops)
        finally:
            self.flying -= requests
            self._writing.remove(records)


async def slow_etcd(round_trip: float = 0.005) -> SlowEtcd:
    fake = SlowEtcd(round_trip)
    elected = await elected_etcd()
    fake._kv, fake.revision = elected._kv, elected.revision
    return fake


async def created(rec: Reconciler, etcd: SlowEtcd, ids: list[str]) -> None:
    """The ingresses exist (revision 1, one request); the counts start afresh."""
    await rec.submit([record(iid, upstream=UP) for iid in ids])
    etcd.most_flying = 0


async def closed_loop(rec: Reconciler, ids: list[str], revisions: int, until: asyncio.Event | None = None) -> None:
    """One client per id pushing revisions 2..`revisions` of it (or on until `until` is set); two ids of the same
    ingress make two clients race on it."""

    async def client(iid: str, port: int) -> None:
        revision = 1
        while revision < revisions or (until is not None and not until.is_set()):
            revision += 1
            upstream = {"servers": [{"url": f"http://10.0.0.5:{port + revision % 100}"}]}
            try:
                await rec.submit([record(iid, upstream=upstream, revision=revision)])
            except Exception:  # noqa: BLE001 - two clients on one ingress: the slower one's revision is stale
                continue

    await asyncio.gather(*(client(iid, 8000 + 100 * n) for n, iid in enumerate(ids)))


@pytest.mark.parametrize("batches", [1, 2])
async def test_sustained_load_commits_that_many_batches_at_once_never_two_on_one_ingress(batches: int) -> None:
    etcd = await slow_etcd()
    ids = [uid() for _ in range(CLIENTS)]
    async with running(etcd, leader=Leader(), coalesce_window=0.02, batches_in_flight=batches) as rec:
        await created(rec, etcd, ids)
        started = len(etcd.txns)
        await closed_loop(rec, ids + ids[:4], revisions=12)  # four ingresses pushed by two clients each
        assert etcd.most_flying == batches
        assert etcd.shared == []
        for iid in ids:
            stored = rec.store.get(IngressRef(AUTHORITY, iid))
            assert stored is not None and stored.revision == 12
            assert etcd.value(LAYOUT.record_key(IngressRef(AUTHORITY, iid))) == stored.value
        # Batches, not one transaction per request: several requests share each.
        assert len(etcd.txns) - started < 12 * CLIENTS / 4


async def test_paced_to_a_traefik_one_batch_at_a_time() -> None:
    etcd = await slow_etcd()
    ids = [uid() for _ in range(CLIENTS)]
    async with running(etcd, leader=Leader(), coalesce_window=0.02, batches_in_flight=2, behind=lambda _root: False) as rec:
        await created(rec, etcd, ids)
        await closed_loop(rec, ids, revisions=6)
        assert etcd.most_flying == 1
        assert all(rec.store.get(IngressRef(AUTHORITY, iid)).revision == 6 for iid in ids)  # type: ignore[union-attr]


async def test_events_that_came_during_a_transaction_wait_for_its_reply_not_for_later_ones() -> None:
    # With batches in flight together there may never be a moment without a transaction in
    # flight: a watch event waits only for the transactions in flight when it came.
    etcd = await slow_etcd(round_trip=0)
    first, second, other = uid(), uid(), uid()
    gates = [asyncio.Event(), asyncio.Event()]
    in_flight: list[str] = []
    async with running(etcd, leader=Leader()) as rec:
        await created(rec, etcd, [first, second, other])
        inner = etcd.txn

        async def gated(compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
            mine = next((iid for iid in (first, second) if LAYOUT.record_key(IngressRef(AUTHORITY, iid)) in {o.key for o in ops}), None)
            if mine is not None:
                in_flight.append(mine)
                await gates[(first, second).index(mine)].wait()
            return await inner(compares, ops)

        etcd.txn = gated  # type: ignore[method-assign]
        one = asyncio.create_task(rec.submit([record(first, upstream=UP, revision=2)]))
        await eventually(lambda: _listed(in_flight, first))
        edited = await etcd.put(rule_key(other), "Host(`edited.test`)")
        await eventually(lambda: _delivered(etcd, LAYOUT.roots_prefix, edited))
        two = asyncio.create_task(rec.submit([record(second, upstream=UP, revision=2)]))
        await eventually(lambda: _listed(in_flight, second))
        gates[0].set()
        await one
        # The second transaction is still in flight; the edit is in the mirror all the same.
        await eventually(lambda: _observed(rec, rule_key(other), "Host(`edited.test`)"), timeout=2)
        assert not two.done()
        gates[1].set()
        await two
        await eventually(lambda: _value_is(etcd, rule_key(other), f"Host(`{other}.test`)"))


async def _listed(seen: list[str], iid: str) -> bool:
    return iid in seen


async def _delivered(etcd: FakeEtcd, prefix: str, revision: int) -> bool:
    return etcd.delivered.get(prefix, 0) >= revision


async def _observed(rec: Reconciler, key: str, value: str) -> bool:
    seen = rec.observed.get(key)
    return seen is not None and seen[0] == value


async def _value_is(etcd: FakeEtcd, key: str, value: str) -> bool:
    return etcd.value(key) == value
