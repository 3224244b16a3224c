"""Planning, ordering, packing and the printed diff (pure logic)."""

from __future__ import annotations

import pytest

from exporter.etcd.types import Compare
from exporter.ingress import Ingress
from exporter.keys import IngressRef, KeyLayout
from exporter.plan.diff import plan_ingress, plan_orphan
from exporter.plan.format import format_plan
from exporter.plan.guards import order_changes, with_record
from exporter.plan.plan import Change, Plan, UnitPlan
from exporter.plan.planner import Planner
from exporter.render.renderer import RenderedIngress, Renderer
from exporter.render.root_keys import DefaultCertificate
from exporter.store.observed import Observed
from exporter.store.records import Record, decode_record
from exporter.write.packing import pack
from tests.helpers import record

PREFIX = "records"
LAYOUT = KeyLayout("traefik/worker_{authority}", PREFIX)
CERT = DefaultCertificate("CERT", "KEY", generated=True)
UP = {"servers": [{"url": "http://10.0.0.5:8000"}]}


def planner() -> Planner:
    return Planner(Renderer(LAYOUT, ["web"]), LAYOUT, CERT)


def observed_after(plan: Plan, obs: Observed, revision: int = 10) -> None:
    for change in plan.changes():
        obs.set(change.key, change.new, revision)


def test_first_plan_creates_root_keys_record_and_objects_with_guards() -> None:
    obs = Observed(LAYOUT)
    rec = record("llama", upstream=UP)
    plan = planner().plan({rec.key: rec}, obs)
    root, unit = plan.units
    assert root.name == "root traefik/worker_test"
    assert {c.key for c in root.changes} == {
        "traefik/worker_test/_meta/owner",
        "traefik/worker_test/tls/stores/default/defaultCertificate/certFile",
        "traefik/worker_test/tls/stores/default/defaultCertificate/keyFile",
        "traefik/worker_test/http/middlewares/exporter-beacon/headers/customRequestHeaders/X-Exporter-Beacon",
    }
    assert unit.name == "test/llama"
    assert all(c.sign == "+" for c in unit.changes)
    assert unit.changes[0].key == LAYOUT.record_key(IngressRef("test", "llama"))
    # The record must not exist yet; objects being created carry no range compare.
    assert unit.compares == [Compare("records/test/llama", "EQUAL", 0)]


def test_idle_plan_is_empty() -> None:
    obs = Observed(LAYOUT)
    rec = record("llama", upstream=UP)
    p = planner()
    observed_after(p.plan({rec.key: rec}, obs), obs)
    again = p.plan({rec.key: rec}, obs)
    assert again.empty and again.foreign == []


def updated_after_revision_7() -> tuple[Planner, Observed, Record]:
    """A planner and a mirror holding revision 1 of an ingress as committed at etcd revision 7, and its revision 2."""
    obs = Observed(LAYOUT)
    p = planner()
    v1 = record("llama", upstream=UP)
    observed_after(p.plan({v1.key: v1}, obs), obs, revision=7)
    return p, obs, record("llama", revision=2, upstream={"servers": [{"url": "http://10.0.0.9:8000"}]})


def test_update_changes_only_what_differs_and_guards_on_observed_revisions() -> None:
    p, obs, v2 = updated_after_revision_7()
    (unit,) = p.plan({v2.key: v2}, obs, owners=[v2.key]).units
    signs = {c.key.rsplit("test_llama/", 1)[-1]: c.sign for c in unit.changes}
    assert signs == {"records/test/llama": "~", "loadBalancer/servers/000/url": "~"}
    assert unit.compares[0] == Compare("records/test/llama", "EQUAL", 7)
    # The mirror is etcd at one revision, records and keys alike: the record compare alone guards the ingress.
    assert unit.compares == [Compare("records/test/llama", "EQUAL", 7)]
    # and the plan records that revision
    obs.revision = 9
    assert p.plan({v2.key: v2}, obs, owners=[v2.key]).revision == 9


def test_removal_deletes_every_owned_key_and_the_record() -> None:
    obs = Observed(LAYOUT)
    p = planner()
    rec = record("llama", upstream=UP)
    observed_after(p.plan({rec.key: rec}, obs), obs)
    (unit,) = p.plan({}, obs, owners=[rec.key]).units
    assert unit.removed and all(c.sign == "-" for c in unit.changes)
    assert unit.changes[-1].key == "records/test/llama"
    owned = [k for k in obs.under_root(LAYOUT.root("test")) if "test_llama" in k]
    assert {c.key for c in unit.changes} == set(owned) | {"records/test/llama"}


def test_drift_inside_an_owned_object_is_repaired_and_foreign_keys_are_reported() -> None:
    obs = Observed(LAYOUT)
    p = planner()
    rec = record("llama", upstream=UP)
    observed_after(p.plan({rec.key: rec}, obs), obs)
    obs.set("traefik/worker_test/http/routers/test_llama/rulez", "x", 11)  # would freeze Traefik
    obs.set("traefik/worker_test/http/routers/test_llama/rule", "Host(`evil.test`)", 11)
    obs.set("traefik/worker_test/http/routers/someone/rule", "Host(`x.test`)", 11)
    obs.set("traefik/worker_test/http/routers/test_ghost/rule", "Host(`g.test`)", 11)  # no record: not ours
    plan = p.plan({rec.key: rec}, obs)
    changes = {c.key: c.sign for c in plan.changes()}
    # The record is put again with the repair: its revision is the ingress's last change.
    assert changes == {
        "traefik/worker_test/http/routers/test_llama/rulez": "-",
        "traefik/worker_test/http/routers/test_llama/rule": "~",
        "records/test/llama": "~",
    }
    (unit,) = plan.units
    assert unit.changes[0] == Change("records/test/llama", rec.value, rec.value)
    assert plan.foreign == ["traefik/worker_test/http/routers/someone/rule", "traefik/worker_test/http/routers/test_ghost/rule"]


def test_generated_certificate_is_only_created_never_replaced() -> None:
    obs = Observed(LAYOUT)
    rec = record("llama", upstream=UP)
    obs.set("traefik/worker_test/tls/stores/default/defaultCertificate/certFile", "OTHER", 3)
    obs.set("traefik/worker_test/tls/stores/default/defaultCertificate/keyFile", "OTHERKEY", 3)
    beacon = LAYOUT.beacon_key("traefik/worker_test")
    obs.set(beacon, "traefik/worker_test w.7", 4)
    plan = planner().plan({rec.key: rec}, obs)
    # The beacon, like a generated certificate, is only created: every transaction rewrites it.
    assert [c.key for c in plan.units[0].changes] == ["traefik/worker_test/_meta/owner"]


def test_every_transaction_counts_one_beacon_put_per_root_it_touches() -> None:
    # 126 changes + the beacon fit 128 with another unit's 1 change under the same root...
    a = UnitPlan("a", [Change(f"r/a{i}", None, "x") for i in range(126)], [], root="r")
    b = UnitPlan("b", [Change("r/b", None, "x")], [], root="r")
    txns, _ = pack([[a], [b]], 128, 1_000_000)
    assert [[u.name for u in t.units] for t in txns] == [["a", "b"]] and txns[0].roots == {"r"}
    # ...but not under another root, which needs a beacon of its own.
    c = UnitPlan("c", [Change("s/c", None, "x")], [], root="s")
    txns, _ = pack([[a], [c]], 128, 1_000_000)
    assert [[u.name for u in t.units] for t in txns] == [["a"], ["c"]]
    # A split unit leaves room for the beacon in every chunk.
    big = UnitPlan("big", [Change(f"r/k{i}", None, "x") for i in range(300)], [], root="r")
    _, split = pack([[big]], 128, 1_000_000)
    assert all(len(chunk.changes) <= 127 and chunk.roots == {"r"} for chunk in split[0])


def test_order_changes_never_leaves_a_router_pointing_at_nothing() -> None:
    changes = [
        Change("r/http/services/a/x", "1", None),
        Change("r/http/routers/a/rule", None, "r"),
        Change("r/http/services/b/x", None, "1"),
        Change("r/http/routers/c/rule", "r", None),
    ]
    ordered = [c.key for c in with_record(order_changes(changes), Change("rec", None, "v"))]
    assert ordered == ["rec", "r/http/routers/c/rule", "r/http/services/b/x", "r/http/routers/a/rule", "r/http/services/a/x"]
    removal = with_record(order_changes([Change("r/http/routers/a/rule", "x", None)]), Change("rec", "v", None))
    assert [c.key for c in removal] == ["r/http/routers/a/rule", "rec"]


def _unit(name: str, n: int, compares: int = 2) -> UnitPlan:
    changes = [Change(f"{name}/k{i}", None, "v") for i in range(n)]
    return UnitPlan(name, changes, [Compare(f"{name}/c{i}", "EQUAL", 0) for i in range(compares)], owner=IngressRef("a", name))


def test_packing_fills_transactions_on_unit_boundaries() -> None:
    units = [[_unit(f"u{i}", 10)] for i in range(30)]
    txns, split = pack(units, 128, 1_000_000)
    assert not split
    assert [len(t.changes) for t in txns] == [120, 120, 60]
    assert all(len(t.compares) <= 128 for t in txns)


def test_packing_respects_the_compare_budget_and_bytes() -> None:
    txns, _ = pack([[_unit(f"u{i}", 1, compares=50)] for i in range(5)], 128, 1_000_000)
    assert [len(t.compares) for t in txns] == [100, 100, 50]
    big = [[UnitPlan(f"u{i}", [Change(f"k{i}", None, "x" * 4000)], [], owner=IngressRef("a", f"u{i}"))] for i in range(10)]
    txns, _ = pack(big, 128, 20_000)
    assert len(txns) > 1 and all(t.bytes <= 20_000 for t in txns)


def test_a_request_group_shares_one_transaction_when_it_fits() -> None:
    groups = [[_unit("a", 100)], [_unit("b", 20), _unit("c", 20)]]
    txns, _ = pack(groups, 128, 1_000_000)
    assert [[u.name for u in t.units] for t in txns] == [["a"], ["b", "c"]]


def test_an_oversized_removal_is_split_with_the_tombstone_first_and_put_again_by_every_later_part() -> None:
    obs = Observed(LAYOUT)
    p = planner()
    servers = {"servers": [{"url": f"http://10.0.{n // 250}.{n % 250}:80"} for n in range(200)]}
    rec = record("llama", upstream=servers)
    observed_after(p.plan({rec.key: rec}, obs), obs)
    tombstone = rec.removal(2, 1000.0)
    (unit,) = p.plan({rec.key: tombstone}, obs, owners=[rec.key]).units
    txns, split = pack([[unit]], 128, 1_000_000)
    assert not txns and len(split) == 1
    chunks = split[0]
    first = chunks[0].changes[0]
    assert first.key == "records/test/llama" and decode_record(first.new or "").removed
    assert all(c.new is None for chunk in chunks for c in chunk.changes[1:])
    # Every later part puts the tombstone again, unchanged: each part moves the record's revision,
    # so a peer that planned against a mirror holding only some parts fails its record compare.
    assert all(chunk.changes[0] == Change(first.key, first.new, first.new) for chunk in chunks[1:])
    assert sum(len(c.changes) - 1 for c in chunks) == len(unit.changes) - 1 > 200


def test_a_tombstone_refuses_older_upserts_and_accepts_newer() -> None:
    from exporter.errors import StaleRevisionError
    from exporter.store.revisions import classify_upsert, tombstone_revision

    rec = record("llama", revision=3, upstream=UP)
    tombstone = rec.removal(5, 1000.0)
    assert tombstone.removed and tombstone.revision == 5
    for stale in (3, 4, 5):
        try:
            classify_upsert(tombstone, record("llama", revision=stale, upstream=UP))
        except StaleRevisionError as exc:
            assert exc.data["stored_revision"] == 5
        else:
            raise AssertionError("a stale upsert after a removal was accepted")
    assert classify_upsert(tombstone, record("llama", revision=6, upstream=UP)) == "apply"
    assert tombstone_revision(tombstone, "test", "llama", 1) is None
    assert decode_record(tombstone.value) == tombstone


def test_plan_ingress_with_no_difference_is_none() -> None:
    assert plan_ingress(
        owner=IngressRef("a", "b"), desired={"k": "v"}, observed_objects={"o": {"k": ("v", 3)}},
        record_key="rec", desired_record=None, observed_record=None,
    ) is None


def test_every_ingress_transaction_is_guarded_by_its_record_compare_alone() -> None:
    rec = record("llama", upstream=UP)

    def unit(observed_record: tuple[str, int] | None) -> UnitPlan | None:
        return plan_ingress(owner=rec.key, desired={"o/k": "v"}, observed_objects={}, record_key="rec", desired_record=rec,
                            observed_record=observed_record)

    new, seen = unit(None), unit(("other", 5))
    assert new is not None and new.compares == [Compare("rec", "EQUAL", 0)]
    assert seen is not None and seen.compares == [Compare("rec", "EQUAL", 5)]


def test_format_prints_added_removed_changed_and_foreign() -> None:
    plan = Plan(
        units=[UnitPlan("u", [Change("a", None, "1"), Change("b", "2", None), Change("c", "3", "4")], [])],
        foreign=["f"],
    )
    assert format_plan(plan) == (
        "+ a = 1\n- b (was 2)\n~ c: 3 -> 4\n! f (foreign key under a managed root: left alone)\n"
    )
    colored = format_plan(plan, color=True)
    assert "\x1b[32m+ a = 1\x1b[0m" in colored
    assert format_plan(Plan()) == ""


class CountingRenderer(Renderer):
    """The renderer, counting the renders it computes (a cache hit is not one)."""

    def __init__(self) -> None:
        super().__init__(LAYOUT, ["web"])
        self.computed = 0

    def _render(self, ingress: Ingress, ejected: frozenset[str]) -> RenderedIngress:
        self.computed += 1
        return super()._render(ingress, ejected)


class Ejecting:
    def __init__(self, urls: frozenset[str] = frozenset()) -> None:
        self.urls = urls

    def ejected(self, ref: IngressRef, ingress: Ingress) -> frozenset[str]:
        return self.urls


def _in_sync(renderer: CountingRenderer) -> tuple[Planner, Observed, Record]:
    """A planner whose one ingress etcd holds as it renders, found so by one plan; renders counted from then on."""
    p, obs, rec = Planner(renderer, LAYOUT, CERT), Observed(LAYOUT), record("llama", upstream=TWO)
    observed_after(p.plan({rec.key: rec}, obs), obs)
    assert p.plan({rec.key: rec}, obs).empty  # found as it renders
    renderer.forget_renders()
    renderer.computed = 0
    return p, obs, rec


TWO = {"servers": [{"url": "http://10.0.0.5:8000"}, {"url": "http://10.0.0.6:8000"}]}


def test_an_ingress_found_as_it_renders_is_not_rendered_again_while_nothing_of_it_changed() -> None:
    renderer = CountingRenderer()
    p, obs, rec = _in_sync(renderer)
    for _ in range(3):
        assert p.plan({rec.key: rec}, obs).empty
    assert renderer.computed == 0


@pytest.mark.parametrize("change", ["edited", "deleted", "added", "record"])
def test_any_change_of_its_keys_or_record_in_etcd_makes_it_rendered_and_repaired(change: str) -> None:
    renderer = CountingRenderer()
    p, obs, rec = _in_sync(renderer)
    url = next(k for k in obs.under_root(LAYOUT.root("test")) if k.endswith("/url"))
    record_key = LAYOUT.record_key(rec.key)
    if change == "edited":
        obs.set(url, "http://10.9.9.9:1", 20)
    elif change == "deleted":
        obs.set(url, None, 20)
    elif change == "added":
        obs.set(url.rsplit("/", 1)[0] + "/weight", "7", 20)
    else:
        obs.set(record_key, '{"source":"api","ingress":{}}', 20)
    (unit,) = p.plan({rec.key: rec}, obs).units
    assert renderer.computed == 1
    expected = {"edited": url, "deleted": url, "added": url.rsplit("/", 1)[0] + "/weight", "record": record_key}[change]
    assert expected in {c.key for c in unit.changes}


def test_a_new_ejection_a_template_reload_or_another_record_renders_it_again() -> None:
    renderer = CountingRenderer()
    ejections = Ejecting()
    p, obs, rec = _in_sync(renderer)
    ejections.urls = frozenset({"http://10.0.0.6:8000"})
    (unit,) = p.plan({rec.key: rec}, obs, None, ejections).units
    assert renderer.computed == 1 and any(c.new is None for c in unit.changes)
    renderer.reload()
    assert p.plan({rec.key: rec}, obs).empty
    assert renderer.computed == 2
    newer = record("llama", upstream=TWO, revision=2)
    (unit,) = p.plan({newer.key: newer}, obs).units
    assert renderer.computed == 3 and [c.key for c in unit.changes] == [LAYOUT.record_key(rec.key)]


def test_orphans_of_one_root_deleted_together_send_their_range_compare_once() -> None:
    units = [plan_orphan(f"r/http/middlewares/shared-allow-{n}", "r", {f"r/http/middlewares/shared-allow-{n}/x": ("v", 3)},
                         "r/http/routers/", 9) for n in range(5)]
    (txn,), _ = pack([units], 128, 1_000_000)
    assert txn.compares == [Compare("r/http/routers/", "LESS", 10, prefix=True)] and len(txn.changes) == 5
