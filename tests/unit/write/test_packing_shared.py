"""Packing the shared objects a plan needs: each written with the first transaction that needs it,
the later ones comparing it present and sent after that one; none written that nothing needs."""

from __future__ import annotations

from exporter.etcd.types import Compare
from exporter.keys import IngressRef
from exporter.plan.plan import Change, UnitPlan
from exporter.write.packing import pack

X = "r/http/middlewares/shared-rate-x"
WITNESS = f"{X}/rateLimit/average"


def shared(path: str = X) -> UnitPlan:
    return UnitPlan(name=f"shared {path}", changes=[Change(f"{path}/rateLimit/average", None, "5")], compares=[], root="r",
                    shared=path)


def ingress(iid: str, keys: int = 10, needs: tuple[tuple[str, str], ...] = ((X, WITNESS),)) -> UnitPlan:
    changes = [Change(f"r/http/services/a_{iid}/k{n}", None, "v") for n in range(keys)]
    changes.append(Change(f"r/http/routers/a_{iid}/middlewares/00", None, "shared-rate-x"))
    return UnitPlan(name=iid, changes=changes, compares=[Compare(f"records/a/{iid}", "EQUAL", 0)], owner=IngressRef("a", iid),
                    record_key=f"records/a/{iid}", root="r", needs=needs)


def test_the_first_transaction_that_needs_a_shared_object_writes_it_ahead_of_the_router() -> None:
    units = [ingress(f"i{n}") for n in range(30)]  # 11 changes each: several transactions of 128
    txns, split = pack([[u] for u in units], 128, 1_000_000, {X: shared()})
    assert not split and len(txns) > 2
    first, *later = txns
    assert first.changes[0].key == WITNESS and not first.requires and not first.after
    assert sum(1 for t in txns for c in t.changes if c.key == WITNESS) == 1
    for txn in later:
        assert txn.requires == [Compare(WITNESS, "GREATER", 0)] and txn.after == [first]


def test_a_shared_object_etcd_holds_already_is_compared_present() -> None:
    (txn,), _ = pack([[ingress("a")]], 128, 1_000_000, {})
    assert txn.requires == [Compare(WITNESS, "GREATER", 0)] and not txn.after
    assert all("shared-" not in c.key for c in txn.changes)


def test_a_shared_object_no_unit_written_now_needs_is_not_written() -> None:
    plain = ingress("b", needs=())
    (txn,), _ = pack([[plain]], 128, 1_000_000, {X: shared()})
    assert [u.name for u in txn.units] == ["b"] and not txn.requires


def test_an_oversized_unit_gets_its_shared_objects_first_in_a_transaction_of_their_own() -> None:
    big = ingress("big", keys=300)
    txns, split = pack([[big]], 128, 1_000_000, {X: shared()})
    (creator,) = txns
    assert [c.key for c in creator.changes] == [WITNESS]
    (chunks,) = split
    assert len(chunks) > 2 and all(c.requires == [Compare(WITNESS, "GREATER", 0)] and c.after == [creator] for c in chunks)
