"""The reconciler's decisions on the in-memory etcd: answers, conflicts, peers, followers, deferred events, outages.

Fast and deterministic; the same behaviours are proven end to end on a real etcd and Traefik
in tests/integration/ (test_writer_invariants.py, test_recovery.py and test_sidecars.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from exporter.errors import EtcdUnavailable, ExporterError, StaleRevisionError, TemplateError
from exporter.etcd.types import Compare, Op
from exporter.ingress import Ingress
from exporter.keys import IngressRef
from exporter.reconcile import Reconciler
from exporter.render.renderer import BUILTIN_TEMPLATES, Renderer
from exporter.sources.api import status_of
from exporter.store.records import RecordStore, Removal, decode_record
from tests.fake_etcd import FakeEtcd
from tests.fake_reconciler import FENCE, LAYOUT, ROOT, UP, Leader, elected_etcd, rule_key, running, until_adopted
from tests.helpers import AUTHORITY, eventually, record, uid


@pytest.fixture
async def etcd() -> FakeEtcd:
    return await elected_etcd()


async def staged(rec: Reconciler, n: int) -> None:
    """Until `n` requests wait in `rec`'s queue (not yet planned)."""

    async def waiting() -> bool:
        return rec.queued_requests == n

    await eventually(waiting, timeout=5, interval=0.001)




async def test_a_request_is_answered_once_committed_and_a_retry_writes_nothing(etcd: FakeEtcd) -> None:
    iid = uid()
    async with running(etcd, leader=Leader()) as rec:
        await rec.submit([record(iid, upstream=UP)])
        assert etcd.value(rule_key(iid)) == f"Host(`{iid}.test`)"
        assert etcd.value(LAYOUT.record_key(IngressRef(AUTHORITY, iid))) is not None
        stored = rec.store.get(IngressRef(AUTHORITY, iid))
        assert stored is not None and stored.revision == 1
        # Requests are guarded by their record compare, never by the leader fence.
        compares, _ops, ok = etcd.txns[-1]
        assert ok and FENCE not in compares
        revision = etcd.revision
        await rec.submit([record(iid, upstream=UP)])
        assert etcd.revision == revision


async def test_removal_leaves_a_tombstone_that_refuses_older_upserts(etcd: FakeEtcd) -> None:
    iid = uid()
    async with running(etcd) as rec:
        await rec.submit([record(iid, upstream=UP)])
        await rec.submit([], [Removal(IngressRef(AUTHORITY, iid), 2)])
        assert etcd.value(rule_key(iid)) is None
        with pytest.raises(StaleRevisionError) as info:
            await rec.submit([record(iid, revision=2, upstream=UP)])
        assert info.value.data["stored_revision"] == 2


async def test_a_foreign_edit_between_plan_and_commit_is_seen_by_the_watch_and_repaired(etcd: FakeEtcd) -> None:
    # The mirror holds every key committed with the record: the record compare alone guards
    # the push (no range scan for etcd), and a key another writer changes meanwhile is drift.
    iid = uid()
    url = f"{ROOT}/http/services/{AUTHORITY}_{iid}/loadBalancer/servers/000/url"
    async with running(etcd) as rec:
        await rec.submit([record(iid, upstream=UP)])

        async def hijack(_c: Sequence[Compare], _o: Sequence[Op]) -> None:
            await etcd.put(url, "http://10.6.6.6:1")

        etcd.before_txn = hijack
        before = len(etcd.txns)
        await rec.submit([record(iid, revision=2, upstream=UP, path_prefix="/v2")])
        compares, _ops, ok = etcd.txns[before]
        assert ok and not any(c.prefix for c in compares)
        assert etcd.value(rule_key(iid)) == f"Host(`{iid}.test`) && PathPrefix(`/v2`)"
        await eventually(lambda: _value_is(etcd, url, "http://10.0.0.5:8000"))


async def test_a_newer_record_a_peer_committed_makes_the_request_stale_and_is_adopted(etcd: FakeEtcd) -> None:
    iid = uid()
    async with running(etcd) as rec, running(etcd) as peer:
        await rec.submit([record(iid, upstream=UP)])
        newer = record(iid, revision=3, upstream={"servers": [{"url": "http://10.0.0.9:8000"}]})

        async def peer_first(_c: Sequence[Compare], _o: Sequence[Op]) -> None:
            await peer.submit([newer])

        etcd.before_txn = peer_first
        with pytest.raises(StaleRevisionError) as info:
            await rec.submit([record(iid, revision=2, upstream=UP)])
        assert info.value.data == {"authority": AUTHORITY, "id": iid, "stored_revision": 3}
        stored = rec.store.get(IngressRef(AUTHORITY, iid))
        assert stored is not None and stored.revision == 3
        assert etcd.value(f"{ROOT}/http/services/{AUTHORITY}_{iid}/loadBalancer/servers/000/url") == "http://10.0.0.9:8000"


@pytest.mark.parametrize("kind", ["upsert", "remove"])
async def test_a_newer_record_a_peer_commits_while_a_request_waits_to_be_planned_refuses_it(etcd: FakeEtcd, kind: str) -> None:
    # The request is checked against revision 1 on arrival; while it waits in a burst, a peer
    # commits revision 3 and the watch brings it in. The plan's record guard then compares
    # against the peer's record and would pass: the request must be refused, never written.
    iid, other = uid(), uid()
    ref = IngressRef(AUTHORITY, iid)
    async with running(etcd, coalesce_window=1.5) as rec, running(etcd) as peer:
        await rec.submit([record(iid, upstream=UP)])
        stale = rec.submit([record(iid, revision=2, upstream=UP)]) if kind == "upsert" else rec.submit([], [Removal(ref, 2)])
        waiting = asyncio.gather(stale, rec.submit([record(other, upstream=UP)]), return_exceptions=True)
        await staged(rec, 2)  # the loop gathers both as one burst
        await peer.submit([record(iid, revision=3, upstream={"servers": [{"url": "http://10.0.0.9:8000"}]})])

        await until_adopted(rec, ref, 3)
        refused, answered = await waiting
        assert isinstance(refused, StaleRevisionError) and refused.data["stored_revision"] == 3
        assert answered is None
        value = etcd.value(LAYOUT.record_key(ref))
        assert value is not None and decode_record(value).revision == 3 and not decode_record(value).removed
        assert etcd.value(f"{ROOT}/http/services/{AUTHORITY}_{iid}/loadBalancer/servers/000/url") == "http://10.0.0.9:8000"


async def test_a_request_one_of_whose_ingresses_turns_stale_before_its_plan_writes_none_of_them(etcd: FakeEtcd) -> None:
    iid, other, alone = uid(), uid(), uid()
    async with running(etcd, coalesce_window=1.5) as rec, running(etcd) as peer:
        await rec.submit([record(iid, upstream=UP)])
        both = rec.submit([record(iid, revision=2, upstream=UP), record(other, upstream=UP)])
        waiting = asyncio.gather(both, rec.submit([record(alone, upstream=UP)]), return_exceptions=True)
        await staged(rec, 2)
        await peer.submit([record(iid, revision=3, upstream=UP)])

        await until_adopted(rec, IngressRef(AUTHORITY, iid), 3)
        refused, answered = await waiting
        assert isinstance(refused, StaleRevisionError) and refused.data["id"] == iid
        assert answered is None and etcd.value(rule_key(alone)) is not None
        assert etcd.value(LAYOUT.record_key(IngressRef(AUTHORITY, other))) is None and etcd.value(rule_key(other)) is None


async def test_an_upsert_and_a_remove_gathered_over_an_older_tombstone_leave_the_newer_tombstone(etcd: FakeEtcd) -> None:
    # Removed at 1; then an upsert of 2 and a remove of 3 share one burst: the ingress stays
    # removed, but at 3, so that a late copy of the upsert of 2 cannot bring it back.
    iid, other = uid(), uid()
    ref = IngressRef(AUTHORITY, iid)
    async with running(etcd, coalesce_window=0.5) as rec:
        await rec.submit([record(iid, upstream=UP)])
        await rec.submit([], [Removal(ref, 1)])
        await asyncio.gather(rec.submit([record(iid, revision=2, upstream=UP)]), rec.submit([], [Removal(ref, 3)]),
                             rec.submit([record(other, upstream=UP)]))
        value = etcd.value(LAYOUT.record_key(ref))
        assert value is not None and decode_record(value).removed and decode_record(value).revision == 3
        with pytest.raises(StaleRevisionError):
            await rec.submit([record(iid, revision=2, upstream=UP)])


@pytest.mark.parametrize("refused_first", [True, False])
async def test_a_refused_request_leaves_another_request_for_the_same_ingress_in_the_batch_written(
    etcd: FakeEtcd, refused_first: bool
) -> None:
    # X turns stale under request A = {X, Y}; request B changes Y alone in the same burst. A is
    # refused whole, B is written, from its own record whether it came before A or after it.
    x, y = uid(), uid()
    async with running(etcd, coalesce_window=1.5) as rec, running(etcd) as peer:
        await rec.submit([record(x, upstream=UP), record(y, upstream=UP)])
        y_of_a, y_of_b = (3, 2) if not refused_first else (2, 3)
        a = rec.submit([record(x, revision=2, upstream=UP), record(y, revision=y_of_a, upstream=UP)])
        b = rec.submit([record(y, revision=y_of_b, upstream=UP)])
        waiting = asyncio.gather(*((a, b) if refused_first else (b, a)), return_exceptions=True)
        await staged(rec, 2)
        await peer.submit([record(x, revision=5, upstream=UP)])

        await until_adopted(rec, IngressRef(AUTHORITY, x), 5)
        answers = await waiting
        refused, answered = answers if refused_first else answers[::-1]
        assert isinstance(refused, StaleRevisionError) and refused.data["id"] == x
        assert answered is None
        value = etcd.value(LAYOUT.record_key(IngressRef(AUTHORITY, y)))
        assert value is not None and decode_record(value).revision == y_of_b


async def test_a_removal_a_peer_made_newer_while_ours_waits_is_kept_and_ours_answered(etcd: FakeEtcd) -> None:
    # Our remove without a revision leaves a tombstone of 1; before it is planned a peer stores 2
    # and removes it at 2. Ours is done (removed already, and newer), and must not go back over it.
    iid, other = uid(), uid()
    ref = IngressRef(AUTHORITY, iid)
    async with running(etcd, coalesce_window=1.5) as rec, running(etcd) as peer:
        await rec.submit([record(iid, upstream=UP)])
        waiting = asyncio.gather(rec.submit([], [Removal(ref, None)]), rec.submit([record(other, upstream=UP)]))
        await staged(rec, 2)
        await peer.submit([record(iid, revision=2, upstream=UP)])
        await peer.submit([], [Removal(ref, 2)])

        await until_adopted(rec, ref, 2, removed=True)
        await waiting
        value = etcd.value(LAYOUT.record_key(ref))
        assert value is not None and decode_record(value).removed and decode_record(value).revision == 2


async def test_the_same_record_committed_by_a_peer_answers_the_request_without_a_second_write(etcd: FakeEtcd) -> None:
    iid = uid()
    wanted = record(iid, revision=2, upstream=UP)
    async with running(etcd) as rec, running(etcd) as peer:
        await rec.submit([record(iid, upstream=UP)])

        async def peer_first(_c: Sequence[Compare], _o: Sequence[Op]) -> None:
            await peer.submit([wanted])

        etcd.before_txn = peer_first
        before = len(etcd.txns)
        await rec.submit([wanted])
        # The peer's commit and our failed attempt; nothing after it.
        assert [ok for _c, _o, ok in etcd.txns[before:]] == [True, False]


async def test_a_follower_writes_requests_but_never_repairs_drift(etcd: FakeEtcd) -> None:
    iid = uid()
    follower_role = Leader(leading=False)
    async with running(etcd, leader=follower_role) as follower:
        await follower.submit([record(iid, upstream=UP)])
        assert etcd.value(rule_key(iid)) == f"Host(`{iid}.test`)"
        await etcd.put(rule_key(iid), "Host(`edited.test`)")
        follower.request_full()
        passes = follower.status.full_passes
        await eventually(lambda: _passed(follower, passes))
        assert etcd.value(rule_key(iid)) == "Host(`edited.test`)"
        # Leadership gained: the drift is repaired, fenced by the election key.
        follower_role.leading = True
        follower.request_full()
        await eventually(lambda: _value_is(etcd, rule_key(iid), f"Host(`{iid}.test`)"))
        compares, _ops, ok = etcd.txns[-1]
        assert ok and FENCE in compares


async def test_a_deposed_leaders_fenced_repair_commits_nothing(etcd: FakeEtcd) -> None:
    iid = uid()
    async with running(etcd, leader=Leader()) as rec:
        await rec.submit([record(iid, upstream=UP)])
        # A successor re-created the election key: our fence no longer holds.
        await etcd.delete("records.leader")
        await etcd.put("records.leader", "successor")
        await etcd.put(rule_key(iid), "Host(`edited.test`)")
        await eventually(lambda: _failed_fenced_txn(etcd))
        assert etcd.value(rule_key(iid)) == "Host(`edited.test`)"


async def test_a_watch_message_waits_for_the_replies_in_flight_ours_are_not_drift_and_others_are_repaired(etcd: FakeEtcd) -> None:
    iid, other = uid(), uid()
    async with running(etcd, leader=Leader()) as rec:
        await rec.submit([record(other, upstream=UP)])

        async def edit_while_we_write(_c: Sequence[Compare], _o: Sequence[Op]) -> None:
            # The watch hands the edit over while our transaction is in flight: applied after its reply.
            await etcd.put(rule_key(other), "Host(`edited.test`)")

        etcd.before_txn = edit_while_we_write
        await rec.submit([record(iid, upstream=UP)])
        await eventually(lambda: _value_is(etcd, rule_key(other), f"Host(`{other}.test`)"))
        # Our own writes were never taken for drift: only the edited ingress was repaired.
        repaired = [ops for c, ops, ok in etcd.txns if ok and FENCE in c]
        record_key = LAYOUT.record_key(IngressRef(AUTHORITY, other))
        assert len(repaired) == 1 and {op.key for op in repaired[0]} == {record_key, rule_key(other), LAYOUT.beacon_key(ROOT)}


async def test_a_bulk_keeps_the_one_watch_running_and_a_foreign_write_during_it_is_repaired(etcd: FakeEtcd) -> None:
    ids = sorted(uid() for _ in range(1000))
    calls = 0
    edited_at: list[int] = []

    async def edit_mid_bulk(_c: Sequence[Compare], _o: Sequence[Op]) -> None:
        nonlocal calls
        calls += 1
        if calls < 3:
            etcd.before_txn = edit_mid_bulk
            return
        # The first ingress (planned and written first) is already in etcd: someone edits it.
        edited_at.append(await etcd.put(rule_key(ids[0]), "Host(`edited.test`)"))

    async with running(etcd, leader=Leader()) as rec:
        await eventually(lambda: _watches_created(etcd, 1))
        etcd.before_txn = edit_mid_bulk
        await rec.submit([record(i, upstream=UP) for i in ids])
        assert edited_at and len([ok for _c, _o, ok in etcd.txns if ok]) > 10
        await eventually(lambda: _value_is(etcd, rule_key(ids[0]), f"Host(`{ids[0]}.test`)"))
        # One watch, never stopped: every commit of the bulk came back through it.
        assert len(etcd.watch_starts) == 1 and rec.observed.revision >= edited_at[0]


async def test_etcd_down_answers_503_and_writes_resume_after_it_returns(etcd: FakeEtcd) -> None:
    iid = uid()
    async with running(etcd) as rec:
        await etcd.set_down(True)
        with pytest.raises(EtcdUnavailable):
            await rec.submit([record(iid, upstream=UP)])
        assert not rec.status.etcd_ok
        assert status_of(EtcdUnavailable("x")) == 503
        await etcd.set_down(False)
        await eventually(lambda: _etcd_ok(rec))
        await rec.submit([record(iid, upstream=UP)])
        assert etcd.value(rule_key(iid)) == f"Host(`{iid}.test`)"


class _EjectAllOnSecondLook:
    """Ejects nothing when a request is admitted, every server when it is planned."""

    def __init__(self) -> None:
        self.calls = 0

    def ejected(self, ref: IngressRef, ingress: Ingress) -> frozenset[str]:
        self.calls += 1
        return frozenset() if self.calls == 1 else frozenset({"http://10.0.0.5:8000"})


async def test_a_render_that_fails_at_plan_time_answers_template_error_400_and_writes_nothing(
    etcd: FakeEtcd, tmp_path: Path
) -> None:
    # A template that cannot render a load balancer without servers.
    builtin = (BUILTIN_TEMPLATES / "http.json.j2").read_text()
    (tmp_path / "http.json.j2").write_text("{% if not primary.servers %}not json{% endif %}" + builtin)
    iid = uid()
    async with running(etcd, ejections=_EjectAllOnSecondLook(), renderer=Renderer(LAYOUT, ["web"], tmp_path)) as rec:
        with pytest.raises(TemplateError) as info:
            await rec.submit([record(iid, upstream=UP)])
        assert status_of(info.value) == 400
        assert etcd.keys(f"{ROOT}/http/routers/") == {} and etcd.keys(LAYOUT.records_dir) == {}
        assert IngressRef(AUTHORITY, iid) in rec.render_errors


async def _passed(rec: Reconciler, passes: int) -> bool:
    return rec.status.full_passes > passes


async def _watches_created(etcd: FakeEtcd, count: int) -> bool:
    return len(etcd.watch_starts) == count


async def _value_is(etcd: FakeEtcd, key: str, value: str) -> bool:
    return etcd.value(key) == value


async def _failed_fenced_txn(etcd: FakeEtcd) -> bool:
    return any(not ok and FENCE in c for c, _o, ok in etcd.txns)


async def _etcd_ok(rec: Reconciler) -> bool:
    return rec.status.etcd_ok


class _FailsOnce:
    """An ejection lookup with a bug that strikes once, at plan time."""

    def __init__(self) -> None:
        self.calls = 0

    def ejected(self, ref: IngressRef, ingress: Ingress) -> frozenset[str]:
        self.calls += 1
        if self.calls == 1:  # built-in templates cannot fail: the first render is the plan's
            raise RuntimeError("a bug")
        return frozenset()


async def test_an_unexpected_error_fails_the_queued_request_and_the_loop_carries_on(etcd: FakeEtcd) -> None:
    first, second = uid(), uid()
    async with running(etcd, ejections=_FailsOnce()) as rec:
        with pytest.raises(ExporterError) as info:
            await rec.submit([record(first, upstream=UP)])
        assert "internal error" in info.value.title
        await rec.submit([record(second, upstream=UP)])
        assert etcd.value(rule_key(second)) == f"Host(`{second}.test`)"


async def test_the_ledger_knows_the_parts_of_a_split_write_and_every_part_moves_the_record(etcd: FakeEtcd) -> None:
    etcd.max_txn_ops = 16  # 40 servers: the ingress is written as several transactions, its record in the first
    iid = uid()
    ref = IngressRef(AUTHORITY, iid)
    servers = {"servers": [{"url": f"http://10.0.0.5:{8000 + n}"} for n in range(40)]}
    seen: list[int] = []
    async with running(etcd) as rec:

        async def between_parts(_c: Sequence[Compare], ops: Sequence[Op]) -> None:
            if any(f"_{iid}" in op.key for op in ops):
                seen.append(rec.ledger.pending(ref))
            etcd.before_txn = between_parts

        etcd.before_txn = between_parts
        await rec.submit([record(iid, upstream=servers)])
        etcd.before_txn = None
        parts = [ops for _c, ops, ok in etcd.txns if ok and any(f"_{iid}" in op.key for op in ops)]
        assert len(seen) == len(parts) >= 3
        # Before each part: the parts not committed yet.
        assert seen == list(range(len(seen), 0, -1))
        assert rec.ledger.pending(ref) == 0
        # Every part puts the record again: it ends at the last part's revision, like the keys.
        assert rec.ledger.revision_of(ref) == etcd.revision == rec.ledger.record_revision(ref)
        assert all(any(op.key == LAYOUT.record_key(ref) for op in ops) for ops in parts)


async def test_a_retried_batch_writes_its_own_record_not_that_of_a_request_queued_after_it(etcd: FakeEtcd) -> None:
    # A batch's first transaction loses its compare; while it re-reads, a newer request for the
    # same ingress is queued, which is stale by the time it is planned (a peer stored a newer
    # revision of its other ingress). The retry must write the batch's own record: writing the
    # queued one would leave etcd holding a record the store does not know (the store takes the
    # batch's), and a later plan from the store would write the older one back over it.
    x, y = uid(), uid()
    xref, yref = IngressRef(AUTHORITY, x), IngressRef(AUTHORITY, y)
    later: list[asyncio.Task[None]] = []
    async with running(etcd, leader=Leader()) as rec:
        await rec.submit([record(x, upstream=UP), record(y, upstream=UP)])

        async def peer_edit_then_newer_request(_c: Sequence[Compare], _o: Sequence[Op]) -> None:
            await etcd.put(rule_key(x), "Host(`edited.test`)")  # the batch's compare fails: it is retried
            later.append(asyncio.create_task(rec.submit([record(x, upstream=UP, revision=3), record(y, upstream=UP, revision=4)])))
            await staged(rec, 1)  # behind the batch
            await etcd.put(LAYOUT.record_key(yref), record(y, upstream=UP, revision=5).value)  # a peer's newer y

        etcd.before_txn = peer_edit_then_newer_request
        await rec.submit([], [Removal(xref, 2)])
        with pytest.raises(StaleRevisionError):
            await later[0]
        stored = decode_record(etcd.value(LAYOUT.record_key(xref)) or "")
        assert stored.removed and stored.revision == 2
        known = rec.store.latest(xref)
        assert known is not None and known.value == stored.value


async def test_a_drift_repair_never_writes_a_request_queued_meanwhile_which_is_then_refused_whole(etcd: FakeEtcd) -> None:
    # x drifts; its repair loses its compare (a peer rewrote x's record as it was) and is planned
    # again while a request for x and y waits in the queue, which is refused as a whole once a
    # peer stores a newer y. The repair must restore x from its committed record: planning it
    # from the queued one would write part of a request answered 409.
    x, y = uid(), uid()
    xref, yref = IngressRef(AUTHORITY, x), IngressRef(AUTHORITY, y)
    later: list[asyncio.Task[None]] = []
    async with running(etcd, leader=Leader()) as rec:
        await rec.submit([record(x, upstream=UP), record(y, upstream=UP)])
        committed_x = etcd.value(LAYOUT.record_key(xref)) or ""

        async def queue_request_then_peer_writes(_c: Sequence[Compare], _o: Sequence[Op]) -> None:
            later.append(asyncio.create_task(rec.submit([record(x, upstream=UP, revision=2), record(y, upstream=UP, revision=2)])))
            await staged(rec, 1)
            await etcd.put(LAYOUT.record_key(xref), committed_x)  # the repair's record compare fails
            await etcd.put(LAYOUT.record_key(yref), record(y, upstream=UP, revision=3).value)

        etcd.before_txn = queue_request_then_peer_writes
        await etcd.put(rule_key(x), "Host(`edited.test`)")

        async def queued() -> bool:
            return bool(later)

        await eventually(queued)
        with pytest.raises(StaleRevisionError):
            await later[0]
        await eventually(lambda: _value_is(etcd, rule_key(x), f"Host(`{x}.test`)"))
        assert decode_record(etcd.value(LAYOUT.record_key(xref)) or "").revision == 1
        known = rec.store.latest(xref)
        assert known is not None and known.revision == 1


async def test_queued_requests_count_each_staged_request_once_until_taken() -> None:
    from exporter.reconcile.intents import Intents

    intents = Intents(RecordStore())
    a, b = record(uid("q"), upstream=UP), record(uid("q"), upstream=UP)
    intents.stage([(a.key, a), (b.key, b)])
    intents.stage([(a.key, a)])
    intents.stage([])  # a request that changes nothing queues nothing
    assert intents.queued_requests == 2
    assert len(intents.take()) == 3 and intents.queued_requests == 0
