"""Pacing on the in-memory etcd: while Traefik is behind, records commit alone and keys wait, then go together.

A stand-in for the Traefik observer says whether a root is behind (its applied beacon older
than the newest one); the same behaviour on a real etcd and Traefik is in test_convergence.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence

import pytest

from exporter.etcd.types import Compare
from exporter.keys import IngressRef
from exporter.reconcile import Reconciler
from exporter.store.records import Removal
from tests.fake_etcd import FakeEtcd
from tests.fake_reconciler import LAYOUT, ROOT, UP, Leader, elected_etcd, rule_key
from tests.fake_reconciler import running as fake_running
from tests.helpers import AUTHORITY, eventually, record, uid

BEACON = LAYOUT.beacon_key(ROOT)


class Traefik:
    """Applies the root's beacon only when told to (`apply`); `behind` is what the pacer asks."""

    def __init__(self) -> None:
        self.applied = 0
        self.reconciler: Reconciler | None = None

    def behind(self, root: str) -> bool:
        assert self.reconciler is not None
        latest = self.reconciler.observed.beacons.latest(root)
        return latest is not None and latest.revision > self.applied

    def apply(self) -> None:
        """Traefik shows the newest beacon; the observer's check then tells the reconciler."""
        assert self.reconciler is not None
        latest = self.reconciler.observed.beacons.latest(ROOT)
        self.applied = latest.revision if latest else 0
        self.reconciler.traefik_checked()


@contextlib.asynccontextmanager
async def running(
    etcd: FakeEtcd, traefik: Traefik | None, *, leader: Leader | None = None, hold_max: float = 30.0
) -> AsyncIterator[Reconciler]:
    """A reconciler paced to `traefik` (None: no Traefik to ask, never paced)."""

    def attach(rec: Reconciler) -> None:
        if traefik is not None:
            traefik.reconciler = rec

    async with fake_running(
        etcd, leader=leader, behind=traefik.behind if traefik else None, pace_hold_max=hold_max, built=attach
    ) as rec:
        yield rec


@pytest.fixture
async def etcd() -> FakeEtcd:
    return await elected_etcd()


async def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll a plain condition with a deadline."""

    async def holds() -> bool:
        return check()

    await eventually(holds, timeout)


def ref(iid: str) -> IngressRef:
    return IngressRef(AUTHORITY, iid)


def root_txns(etcd: FakeEtcd, since: int) -> list[Sequence[Compare]]:
    """The committed transactions after `since` that wrote under the root (they rewrite its beacon)."""
    return [c for c, ops, ok in etcd.txns[since:] if ok and any(op.key == BEACON for op in ops)]


async def test_a_converged_root_is_written_as_today_records_and_keys_in_one_transaction(etcd: FakeEtcd) -> None:
    traefik = Traefik()
    async with running(etcd, traefik) as rec:
        traefik.apply()
        iid = uid()
        before = len(etcd.txns)
        await rec.submit([record(iid, upstream=UP)])
        assert etcd.value(rule_key(iid)) == f"Host(`{iid}.test`)"
        assert len(root_txns(etcd, before)) == 1 and len(etcd.txns) == before + 1
        assert not rec.keys_pending(ref(iid))


async def test_while_traefik_is_behind_records_commit_alone_and_the_held_keys_go_in_one_revision(etcd: FakeEtcd) -> None:
    traefik = Traefik()
    async with running(etcd, traefik) as rec:
        traefik.apply()
        first, *later = [uid() for _ in range(6)]
        await rec.submit([record(first, upstream=UP)])  # Traefik has not applied this one yet
        before, revision = len(etcd.txns), etcd.revision
        for iid in later:
            await rec.submit([record(iid, upstream=UP)])
            # Durable: its record is in etcd; its keys wait, and nothing under the root changed.
            assert etcd.value(LAYOUT.record_key(ref(iid))) is not None
            assert etcd.value(rule_key(iid)) is None and rec.keys_pending(ref(iid))
        assert root_txns(etcd, before) == []
        assert rec.pacer.backlog(ROOT).ingresses == len(later)
        assert etcd.revision == revision + len(later)  # one record each, nothing else

        traefik.apply()
        await until(lambda: all(etcd.value(rule_key(i)) is not None for i in later))
        assert len(root_txns(etcd, before)) == 1  # every held ingress in one revision under the root
        assert not any(rec.keys_pending(ref(i)) for i in later)
        assert rec.pacer.backlog(ROOT).ingresses == 0
        # What Traefik must apply for them to be served is the keys' revision, not the records'.
        assert {rec.ledger.revision_of(ref(i)) for i in later} == {etcd.revision}


async def test_a_traefik_that_never_applies_holds_keys_for_pace_hold_max_only(etcd: FakeEtcd) -> None:
    traefik = Traefik()
    async with running(etcd, traefik, hold_max=0.3) as rec:
        traefik.apply()
        await rec.submit([record(uid(), upstream=UP)])
        iid = uid()
        await rec.submit([record(iid, upstream=UP)])
        assert etcd.value(rule_key(iid)) is None

        # The observer keeps checking a Traefik that is behind; the hold ends on its own clock.
        def checked() -> bool:
            rec.traefik_checked()
            return etcd.value(rule_key(iid)) is not None

        await until(checked)
        assert not rec.keys_pending(ref(iid))


async def test_a_removal_while_paced_commits_its_tombstone_and_deletes_the_keys_later(etcd: FakeEtcd) -> None:
    traefik = Traefik()
    async with running(etcd, traefik) as rec:
        iid = uid()
        await rec.submit([record(iid, upstream=UP)])
        await rec.submit([record(uid(), upstream=UP)])  # written: Traefik had applied everything before it
        await rec.submit([], [Removal(ref(iid), 2)])
        stored = rec.store.latest(ref(iid))
        assert stored is not None and stored.removed
        assert etcd.value(rule_key(iid)) is not None and rec.keys_pending(ref(iid))
        traefik.apply()
        await until(lambda: etcd.value(rule_key(iid)) is None)


async def test_changes_nobody_asked_for_wait_too_and_a_record_without_key_changes_goes_alone(etcd: FakeEtcd) -> None:
    traefik = Traefik()
    async with running(etcd, traefik, leader=Leader()) as rec:
        iid = uid()
        await rec.submit([record(iid, upstream=UP)])
        # A drifted key while Traefik is behind: the repair is held like any other key change.
        await etcd.put(rule_key(iid), "Host(`hijacked.test`)")
        await until(lambda: rec.pacer.holds(ref(iid)))
        assert etcd.value(rule_key(iid)) == "Host(`hijacked.test`)"
        # Same keys, newer record (a field only the exporter reads): written at once, not under the root.
        before = len(etcd.txns)
        await rec.submit([record(uid(), upstream=UP)])
        assert root_txns(etcd, before) == []
        traefik.apply()
        await until(lambda: etcd.value(rule_key(iid)) == f"Host(`{iid}.test`)")


async def test_a_follower_commits_records_alone_and_leaves_the_keys_to_the_leader(etcd: FakeEtcd) -> None:
    traefik = Traefik()
    async with running(etcd, traefik, leader=Leader(leading=False)) as rec:
        await rec.submit([record(uid(), upstream=UP)])
        iid = uid()
        await rec.submit([record(iid, upstream=UP)])
        assert rec.keys_pending(ref(iid))
        before = len(etcd.txns)
        traefik.apply()
        await until(lambda: not rec.pacer.holds(ref(iid)))
        # A later request is answered after the turn that dropped what a follower may not write.
        await rec.submit([record(uid(), upstream=UP)])
        assert len(etcd.txns) == before + 1 and etcd.value(rule_key(iid)) is None
        assert rec.keys_pending(ref(iid))  # still: its keys are not in etcd
        # The leader (here a second reconciler, its Traefik unknown) renders them: no longer pending.
        async with running(etcd, None, leader=Leader()) as leader:
            await until(lambda: etcd.value(rule_key(iid)) is not None)
            assert not leader.keys_pending(ref(iid))
        await until(lambda: not rec.keys_pending(ref(iid)))
