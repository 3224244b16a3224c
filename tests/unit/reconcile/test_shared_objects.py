"""Shared edge objects on the in-memory etcd: written once per root, created with (or before) the first
router naming them, deleted with (or after) the last one, repaired like any owned key, and no
revision in etcd's history has a router or service naming a missing object.

The same on the real etcd and Traefik: tests/integration/test_shared_objects.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from exporter.etcd.types import Compare, Op
from exporter.keys import IngressRef
from exporter.plan.planner import Planner
from exporter.reconcile import Reconciler
from exporter.render.renderer import Renderer
from exporter.store.records import Removal
from tests.fake_etcd import FakeEtcd
from tests.fake_reconciler import CERT, LAYOUT, ROOT, UP, elected_etcd, running
from tests.helpers import AUTHORITY, eventually, record
from tests.replay import dangling

EDGE = {
    "upstream": UP, "allowed_client_ips": ["10.0.0.0/8"], "timeouts": {"dial": 5}, "keepalive": False,
    "limits": {"max_body_bytes": 1024, "max_in_flight": 4, "rate": {"average": 10, "burst": 20}},
    "retry": {"attempts": 2},
}


@pytest.fixture
async def etcd() -> FakeEtcd:
    return await elected_etcd()


def shared_objects(etcd: FakeEtcd) -> set[str]:
    """The shared objects under the root, by path."""
    return {k.rsplit("/", k.count("/") - ROOT.count("/") - 3)[0] for k in etcd.keys(ROOT + "/") if "/shared-" in k}


def never_dangling(etcd: FakeEtcd) -> list[str]:
    """Replay the fake's history: every revision at which a key under the root names a missing object."""
    state: dict[str, str] = {}
    by_revision: dict[int, list[tuple[str, str | None]]] = {}
    for revision, key, value in etcd.history():
        by_revision.setdefault(revision, []).append((key, value))
    found = []
    for revision in sorted(by_revision):
        for key, value in by_revision[revision]:
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
        found += [f"rev {revision}: {d}" for d in dangling(state, ROOT)]
    return found


def puts_under(etcd: FakeEtcd, marker: str) -> int:
    """How many puts of keys containing `marker` were committed."""
    return sum(1 for _c, ops, ok in etcd.txns if ok for op in ops if op.value is not None and marker in op.key)


async def test_equal_edge_fields_are_written_once_and_named_by_every_router(etcd: FakeEtcd) -> None:
    async with running(etcd) as rec:
        await rec.submit([record(f"m{n}", **EDGE) for n in range(3)])
        objects = shared_objects(etcd)
        assert len(objects) == 6  # allow, rate, in-flight, body, retry, transport
        kv = etcd.keys(ROOT + "/")
        names = {p.rsplit("/", 1)[1] for p in objects}
        for n in range(3):
            chain = {v for k, v in kv.items() if f"/routers/{AUTHORITY}_m{n}/middlewares/" in k}
            assert chain | {kv[f"{ROOT}/http/services/{AUTHORITY}_m{n}/loadBalancer/serversTransport"]} == names
        # One more ingress with the same settings writes only its own keys.
        before = len(etcd.txns)
        await rec.submit([record("m3", **EDGE)])
        (new,) = [ops for _c, ops, ok in etcd.txns[before:] if ok]
        assert not any("/shared-" in op.key for op in new)
    assert never_dangling(etcd) == []


async def test_a_bulk_writes_each_shared_object_in_the_first_transaction_that_needs_it(etcd: FakeEtcd) -> None:
    async with running(etcd) as rec:
        await rec.submit([record(f"b{n}", **EDGE) for n in range(60)])
        committed = [ops for _c, ops, ok in etcd.txns if ok and any("/routers/" in op.key for op in ops)]
        assert len(committed) > 3  # the bulk spans transactions
        shared_keys = {k for k in etcd.keys(ROOT + "/") if "/shared-" in k}
        assert puts_under(etcd, "/shared-") == len(shared_keys)  # each key once
        assert {op.key for op in committed[0] if "/shared-" in op.key} == shared_keys
        # Later transactions compare them present instead.
        later = [c for c, ops, ok in etcd.txns if ok and any("/routers/" in op.key for op in ops)][1:]
        assert all(any(cmp.result == "GREATER" and "/shared-" in cmp.key for cmp in compares) for compares in later)
    assert never_dangling(etcd) == []


async def test_the_last_router_naming_a_shared_object_takes_it_along(etcd: FakeEtcd) -> None:
    async with running(etcd) as rec:
        await rec.submit([record("a", **EDGE), record("b", **EDGE)])
        first = shared_objects(etcd)
        # `a` moves to another in-flight limit: a new object, the old one stays for `b`.
        await rec.submit([record("a", revision=2, **{**EDGE, "limits": {"max_in_flight": 9}})])
        assert first < shared_objects(etcd)
        await rec.submit([], [Removal(IngressRef(AUTHORITY, "b"), 2)])

        async def only_a() -> bool:
            return len(shared_objects(etcd)) == 4  # allow, in-flight 9, retry, transport
        await eventually(only_a, timeout=5)
        await rec.submit([], [Removal(IngressRef(AUTHORITY, "a"), 3)])

        async def none_left() -> bool:
            return not shared_objects(etcd)
        await eventually(none_left, timeout=5)
        assert rec.observed.sharing.orphans() == []
    assert never_dangling(etcd) == []


@pytest.mark.parametrize("damage", ["deleted", "edited"])
async def test_a_foreign_change_to_a_shared_object_is_repaired(etcd: FakeEtcd, damage: str) -> None:
    async with running(etcd) as rec:
        await rec.submit([record("r", **EDGE)])
        rate = next(k for k in etcd.keys(ROOT + "/") if "/shared-rate-" in k and k.endswith("/average"))
        if damage == "deleted":
            await etcd.delete(rate)
        else:
            await etcd.put(rate, "99999")

        async def repaired() -> bool:
            return etcd.value(rate) == "10"
        await eventually(repaired, timeout=5)


async def test_a_shared_object_deleted_by_a_peer_under_a_new_reference_is_written_again(etcd: FakeEtcd) -> None:
    # A peer deletes the object (it saw no router naming it) just before our transaction that names
    # it commits: the presence compare fails, and the re-plan writes it with the router.
    async with running(etcd) as rec:
        await rec.submit([record("one", **EDGE)])
        await rec.submit([], [Removal(IngressRef(AUTHORITY, "one"), 2)])
        await rec.submit([record("keep", **EDGE)])
        objects = shared_objects(etcd)
        retry = next(p for p in objects if "/shared-retry-" in p)
        deleted: list[str] = []

        async def peer_deletes(compares: Sequence[Compare], ops: Sequence[Op]) -> None:
            if not deleted and any("/routers/" in op.key and "two" in op.key for op in ops):
                deleted.append(retry)
                for key in list(etcd.keys(retry + "/")):
                    await etcd.delete(key)

        etcd.before_txn = peer_deletes
        await rec.submit([record("two", **{**EDGE, "upstream": {"servers": [{"url": "http://10.0.0.9:80"}]}})])
        assert deleted and etcd.keys(retry + "/")
    # `keep` named the object while the peer deleted it: that revision is the peer's fault, none after it is ours.
    assert [d for d in never_dangling(etcd) if "_two/" in d] == []


async def test_a_root_in_the_layout_before_moves_to_shared_objects_once(etcd: FakeEtcd) -> None:
    old = {
        f"{ROOT}/http/routers/{AUTHORITY}_old/rule": "Host(`old.test`)",
        f"{ROOT}/http/routers/{AUTHORITY}_old/service": f"{AUTHORITY}_old",
        f"{ROOT}/http/routers/{AUTHORITY}_old/entryPoints/00": "web",
        f"{ROOT}/http/routers/{AUTHORITY}_old/priority": "101",
        f"{ROOT}/http/routers/{AUTHORITY}_old/middlewares/00": f"{AUTHORITY}_old_inflight",
        f"{ROOT}/http/middlewares/{AUTHORITY}_old_inflight/inFlightReq/amount": "4",
        f"{ROOT}/http/services/{AUTHORITY}_old/loadBalancer/servers/000/url": "http://10.0.0.5:8000",
        f"{ROOT}/http/services/{AUTHORITY}_old/loadBalancer/servers/000/weight": "1",
        f"{ROOT}/http/services/{AUTHORITY}_old/loadBalancer/passHostHeader": "true",
    }
    rec_of = record("old", hosts=["old.test"], upstream=UP, limits={"max_in_flight": 4})
    await etcd.txn([], [Op(k, v) for k, v in old.items()] + [Op(f"records/{AUTHORITY}/old", rec_of.value)])
    async with running(etcd) as rec:
        async def moved() -> bool:
            kv = etcd.keys(ROOT + "/")
            return not any(k.endswith(("/weight", "/passHostHeader")) or "_old_inflight" in k for k in kv)
        await eventually(moved, timeout=5)
        kv = etcd.keys(ROOT + "/")
        assert kv[f"{ROOT}/http/routers/{AUTHORITY}_old/middlewares/00"].startswith("shared-inflight-")
        writes = len(etcd.txns)
        rec.request_full()
        passes = rec.status.full_passes

        async def passed() -> bool:
            return rec.status.full_passes > passes
        await eventually(passed, timeout=5)
        assert len(etcd.txns) == writes  # once: nothing left to move
    assert never_dangling(etcd) == []




def _old_layout(iid: str) -> dict[str, str]:
    """The keys the layout before wrote for a typical ingress with an in-flight limit."""
    name = f"{AUTHORITY}_{iid}"
    svc = f"{ROOT}/http/services/{name}/loadBalancer"
    return {
        f"{ROOT}/http/routers/{name}/rule": f"Host(`{iid}.test`)",
        f"{ROOT}/http/routers/{name}/service": name,
        f"{ROOT}/http/routers/{name}/entryPoints/00": "web",
        f"{ROOT}/http/routers/{name}/priority": "101",
        f"{ROOT}/http/routers/{name}/middlewares/00": f"{name}_inflight",
        f"{ROOT}/http/middlewares/{name}_inflight/inFlightReq/amount": "4",
        f"{svc}/servers/000/url": "http://10.0.0.5:8000",
        f"{svc}/servers/000/weight": "1",
        f"{svc}/passHostHeader": "true",
    }


async def test_a_root_in_the_layout_before_is_shown_by_diff_then_moved_in_the_fewest_transactions(etcd: FakeEtcd) -> None:
    ids = [f"o{n}" for n in range(40)]
    for iid in ids:
        rec_of = record(iid, hosts=[f"{iid}.test"], upstream=UP, limits={"max_in_flight": 4})
        await etcd.txn([], [Op(k, v) for k, v in _old_layout(iid).items()] + [Op(f"records/{AUTHORITY}/{iid}", rec_of.value)])
    start = etcd.revision
    # What `diff` prints against the root before the move (a reconciler that only reads): every old
    # key that goes, the shared object once.
    reader = Reconciler(etcd=etcd, layout=LAYOUT, planner=Planner(Renderer(LAYOUT, ["web"]), LAYOUT, CERT))
    await reader.load()
    changes = reader.preview([], []).changes()
    assert {c.key for c in changes if c.new is None} == {
        k for iid in ids for k in _old_layout(iid) if k.endswith(("/weight", "/passHostHeader")) or "_inflight/" in k}
    assert sum(1 for c in changes if "/shared-inflight-" in c.key and c.new is not None) == 1
    assert etcd.revision == start
    async with running(etcd):
        async def moved() -> bool:
            return not any(k.endswith("/weight") for k in etcd.keys(ROOT + "/"))
        await eventually(moved, timeout=5)
        ops = sum(len(ops) for _c, ops, ok in etcd.txns if ok and any(op.key.startswith(ROOT) for op in ops))
        revisions = etcd.revision - start
        # 40 ingresses x (1 router key changed + 4 deleted) + the shared object + beacons, 128 operations a
        # transaction (etcd's default), whole ingresses only: the fewest transactions that can hold them.
        assert ops >= 40 * 5 and revisions <= -(-ops // 127) + 1, (ops, revisions)
    assert never_dangling(etcd) == []


async def test_an_orphan_under_a_root_of_no_ingress_of_ours_is_left_alone(etcd: FakeEtcd) -> None:
    theirs = "traefik/worker_other/http/middlewares/shared-rate-0123456789abcdef/rateLimit/average"
    ours = f"{ROOT}/http/middlewares/shared-rate-fedcba9876543210/rateLimit/average"
    await etcd.put(theirs, "5")
    async with running(etcd) as rec:
        await rec.submit([record("mine", upstream=UP)])
        await etcd.put(ours, "5")  # an orphan under our root: deleted with the next batch

        async def ours_gone() -> bool:
            return etcd.value(ours) is None
        await rec.submit([record("mine", revision=2, upstream={"servers": [{"url": "http://10.0.0.6:80"}]})])
        await eventually(ours_gone, timeout=5)
    assert etcd.value(theirs) == "5"
