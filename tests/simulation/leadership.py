"""Leadership in the simulation: the election key in the scheduled etcd, moved between sidecars by
lease expiries, and each sidecar's belief of it, which a deposed leader keeps until it notices.

A deposed leader that has not noticed still plans the leader's own units (repair, reconcile,
health) and sends them fenced by the create revision it won; the fence must fail them. The
invariant: no transaction of a sidecar's own units commits at a revision where another holds the
key (the campaign's rule 11, judged on every commit).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

from exporter.etcd.types import Compare
from exporter.keys import IngressRef
from exporter.plan.plan import UnitPlan
from exporter.reconcile import Reconciler
from exporter.reconcile.apply import PlanWriter, route

from .etcd import SimEtcd

ELECTION_KEY = "records.leader"


class SimLeader:
    """One sidecar's leadership as it believes it: fenced on the create revision of the key it won."""

    def __init__(self) -> None:
        self.believes = False
        self.create_revision = 0

    def is_leader(self) -> bool:
        return self.believes

    def fence(self) -> Sequence[Compare]:
        return [Compare(ELECTION_KEY, "EQUAL", self.create_revision, target="CREATE")] if self.believes else []


class Election:
    """Who holds the election key from which etcd revision on, and what each sidecar believes."""

    def __init__(self, etcd: SimEtcd, sidecars: int) -> None:
        self.etcd = etcd
        self.leaders = [SimLeader() for _ in range(sidecars)]
        self.holders: list[tuple[int, int | None]] = []  # (from etcd revision, holder)
        self.unaware: set[int] = set()  # deposed, still believing
        self.own_keys: list[set[str]] = [set() for _ in range(sidecars)]  # keys of the own units being written
        self.moves = 0

    async def elect(self, index: int) -> None:
        """`index` wins the key (a new create revision) and knows it at once."""
        await self.etcd.put(ELECTION_KEY, str(index))
        found = await self.etcd.get(ELECTION_KEY)
        assert found is not None
        self.holders.append((self.etcd.revision, index))
        leader = self.leaders[index]
        leader.believes, leader.create_revision = True, found.create_revision
        self.unaware.discard(index)

    async def expire(self, successor: int) -> int | None:
        """The holder's lease expires (its key is deleted) and `successor` wins; the old holder still believes."""
        old = self.holder(self.etcd.revision)
        await self.etcd.delete(ELECTION_KEY)
        self.holders.append((self.etcd.revision, None))
        if old is not None and old != successor:
            self.unaware.add(old)
        await self.elect(successor)
        self.moves += 1
        return old

    def notice(self, index: int) -> None:
        """A deposed leader learns it lost the key."""
        self.leaders[index].believes = False
        self.unaware.discard(index)

    def holder(self, revision: int) -> int | None:
        """Who held the key at `revision`."""
        at = bisect.bisect_right(self.holders, (revision, len(self.leaders))) - 1
        return self.holders[at][1] if at >= 0 else None

    def watch_own_units(self, rec: Reconciler, index: int) -> None:
        """Note the keys of each own-units write of `rec` (the fenced group of PlanWriter._write)."""
        plans = rec._loop._committer._plans  # test instrumentation: the plan writer of this sidecar
        assert isinstance(plans, PlanWriter)
        own_keys = self.own_keys[index]

        async def write(units: list[UnitPlan], groups: Mapping[IngressRef, int]) -> Any:
            _pushed, own, _shared = route(units, groups)
            own_keys.clear()
            own_keys.update(change.key for group in own for unit in group for change in unit.changes)
            return await PlanWriter._write(plans, units, groups)

        plans._write = write  # type: ignore[method-assign]

    def deposed_write(self, owner: int, keys: Sequence[str], revision: int) -> str | None:
        """Why a commit by `owner` at `revision` breaks the invariant (None: it does not)."""
        own = self.own_keys[owner].intersection(keys)
        holder = self.holder(revision)
        if own and holder != owner:
            return f"sidecar {owner} committed its own units ({sorted(own)[0]}, ...) at revision {revision}, held by {holder}"
        return None
