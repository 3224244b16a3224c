"""The one revision order: `supersedes`, every rule that decides by it, and the reconciler's answers.

The table holds, for what is stored (nothing, a live record of 5, a tombstone of 5) and a request
(an upsert, a remove) at 4, 5 or 6, the answer and what etcd holds afterwards; each row is also
derived from `supersedes` alone, so the table and the rule cannot drift apart.
"""

from __future__ import annotations

import itertools

import pytest

from exporter.errors import StaleRevisionError
from exporter.keys import IngressRef
from exporter.plan.planner import Planner
from exporter.reconcile.intents import peer_verdict
from exporter.render.renderer import Renderer
from exporter.store.records import Record, Removal, decode_record, supersedes, tombstone
from exporter.store.revisions import classify_upsert, tombstone_revision
from tests.fake_etcd import FakeEtcd
from tests.fake_reconciler import CERT, LAYOUT, elected_etcd, running
from tests.helpers import AUTHORITY, record, uid

UP = {"servers": [{"url": "http://10.0.0.5:8000"}]}
R = 5


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
    # A request: applied when it wins (a removal at or below a tombstone's revision is a retry), refused otherwise.
    if removed:
        try:
            verdict = "noop" if tombstone_revision(stored, AUTHORITY, "rev", revision) is None else "apply"
        except StaleRevisionError:
            verdict = "stale"
        assert verdict == ("apply" if wins else "noop" if other_removed else "stale")
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


# (stored, request, revision) -> (answer, what etcd holds after: (revision, removed) or None).
# `live*` is an upsert of the stored revision with other content; a revision of None: a remove without one.
TABLE: dict[tuple[str, str, int | None], tuple[int, tuple[int, bool] | None]] = {
    ("none", "upsert", R - 1): (204, (R - 1, False)),
    ("none", "upsert", R): (204, (R, False)),
    ("none", "upsert", R + 1): (204, (R + 1, False)),
    ("none", "remove", R - 1): (204, (R - 1, True)),
    ("none", "remove", R): (204, (R, True)),
    ("none", "remove", R + 1): (204, (R + 1, True)),
    ("none", "remove", None): (204, None),
    ("live", "upsert", R - 1): (409, (R, False)),
    ("live", "upsert", R): (409, (R, False)),
    ("live", "upsert", R + 1): (204, (R + 1, False)),
    ("live", "remove", R - 1): (409, (R, False)),
    ("live", "remove", R): (204, (R, True)),
    ("live", "remove", R + 1): (204, (R + 1, True)),
    ("live", "remove", None): (204, (R, True)),
    ("tombstone", "upsert", R - 1): (409, (R, True)),
    ("tombstone", "upsert", R): (409, (R, True)),
    ("tombstone", "upsert", R + 1): (204, (R + 1, False)),
    ("tombstone", "remove", R - 1): (204, (R, True)),
    ("tombstone", "remove", R): (204, (R, True)),
    ("tombstone", "remove", R + 1): (204, (R + 1, True)),
    ("tombstone", "remove", None): (204, (R, True)),
}


def derived(stored: str, request: str, revision: int | None) -> tuple[int, tuple[int, bool] | None]:
    """The row as `supersedes` alone gives it: a change that supersedes what is stored is stored;
    a remove that does not is a retry where a tombstone is, else (and for an upsert) a 409."""
    before = {"none": None, "live": at(R, False), "tombstone": at(R, True)}[stored]
    held = (before.revision, before.removed) if before is not None else None
    removal = request == "remove"
    if revision is None:  # a remove without a revision takes the stored one
        return 204, (before.revision, True) if before is not None else None
    if before is None or supersedes(revision, removal, before):
        return 204, (revision, removal)
    return (204 if removal and before.removed else 409), held


@pytest.mark.parametrize(("stored", "request_", "revision"), list(TABLE), ids=[f"{s}-{q}-{r}" for s, q, r in TABLE])
async def test_the_revision_table_on_the_reconciler(stored: str, request_: str, revision: int | None) -> None:
    answer, after = TABLE[(stored, request_, revision)]
    assert derived(stored, request_, revision) == (answer, after)
    etcd: FakeEtcd = await elected_etcd()
    iid = uid()
    ref = IngressRef(AUTHORITY, iid)
    async with running(etcd) as rec:
        if stored != "none":
            await rec.submit([record(iid, revision=R, upstream=UP)])
        if stored == "tombstone":
            await rec.submit([], [Removal(ref, R)])
        before, revision_before = etcd.value(LAYOUT.record_key(ref)), etcd.revision
        try:
            if request_ == "upsert":
                await rec.submit([record(iid, revision=revision, upstream=UP, path_prefix="/other")])
            else:
                await rec.submit([], [Removal(ref, revision)])
            got = 204
        except StaleRevisionError as exc:
            got = 409
            assert exc.data["stored_revision"] == R
        assert got == answer
        value = etcd.value(LAYOUT.record_key(ref))
        held = decode_record(value) if value is not None else None
        assert ((held.revision, held.removed) if held is not None else None) == after
        if after is None or (before is not None and after == (decode_record(before).revision, decode_record(before).removed)):
            # A refusal, a retry, or a no-op writes nothing.
            assert etcd.revision == revision_before and value == before
        if request_ == "upsert" and answer == 204:
            assert held is not None and held.ingress.path_prefix == "/other"
        if stored == "tombstone" and after == (R + 1, True):
            # A newer remove moves the tombstone up: its TTL counts from this remove.
            assert held is not None and before is not None and held.removed_at > decode_record(before).removed_at


def test_the_tombstone_of_an_ingress_never_stored_is_a_record_like_any_other() -> None:
    # Sidecars of two versions share etcd during a rolling upgrade: an earlier one reads records with
    # the same decoder, which validates the ingress whole. The placeholder renders nothing.
    ref = IngressRef(AUTHORITY, "gone")
    made = tombstone(ref, 7, 1_700_000_000.5)
    read = decode_record(made.value)
    assert read == made and read.key == ref and read.revision == 7 and read.removed and read.removed_at == 1_700_000_000.5
    assert len(made.value) < 512
    assert Planner(Renderer(LAYOUT, ["web"]), LAYOUT, CERT).rendered(made) == {}
