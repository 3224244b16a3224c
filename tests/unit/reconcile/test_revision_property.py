"""A property of the revision rules on the reconciler over the in-memory etcd, with two sidecars.

Upserts and removes of a few ingresses, with revisions drawn in any order, are sent one at a
time to either sidecar; with some of them the other sidecar's watches are held back until its
next transaction, so it checks and plans its next request against a view older than this commit
(it learns of it at its own commit: a conflict, then the judge). After every answer,
what etcd holds for each ingress is what the highest acknowledged change of it asked for: a
live record of that revision and content, or a tombstone of it, a remove winning a tie. An
acknowledged remove at R thus refuses every later upsert at or below R.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.errors import StaleRevisionError
from exporter.etcd.types import Compare, Op, TxnResult, WatchEvent
from exporter.keys import IngressRef
from exporter.store.records import Removal, decode_record
from tests.fake_etcd import FakeEtcd
from tests.fake_reconciler import LAYOUT, UP, elected_etcd, running
from tests.helpers import AUTHORITY, record, uid

# (ingress, op, revision, sidecar, content, the other sidecar's watches held until its next transaction)
Step = tuple[int, str, int, int, int, bool]
steps = st.lists(
    st.tuples(st.integers(0, 2), st.sampled_from(["upsert", "remove"]), st.integers(0, 6), st.integers(0, 1), st.integers(0, 1),
              st.booleans()),
    min_size=1, max_size=24,
)


class Lagging:
    """One sidecar's connection to the shared in-memory etcd, whose watches `lag()` holds back until its next transaction."""

    def __init__(self, etcd: FakeEtcd) -> None:
        self._etcd = etcd
        self._flowing = asyncio.Event()
        self._flowing.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._etcd, name)

    def lag(self) -> None:
        self._flowing.clear()

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        self._flowing.set()
        return await self._etcd.txn(compares, ops)

    async def watch_prefix(
        self, prefix: str, start_revision: int, idle_timeout: float, *, end: str | None = None
    ) -> AsyncIterator[list[WatchEvent]]:
        async for events in self._etcd.watch_prefix(prefix, start_revision, idle_timeout, end=end):
            await self._flowing.wait()
            yield events
# What a change leaves in etcd: (revision, removed, path of a live record).
State = tuple[int, bool, str]


def stronger(change: State, acknowledged: State | None) -> bool:
    """True when `change` outranks `acknowledged`: a higher revision, or a remove at the same one."""
    return acknowledged is None or (change[0], change[1]) > (acknowledged[0], acknowledged[1])


async def scenario(plan: list[Step]) -> None:
    etcd = await elected_etcd()
    names = [uid() for _ in range(3)]
    refs = [IngressRef(AUTHORITY, name) for name in names]
    highest: dict[int, State] = {}
    links = [Lagging(etcd), Lagging(etcd)]
    async with running(links[0]) as first, running(links[1]) as second:
        for step, (which, op, revision, sidecar, content, lag) in enumerate(plan):
            sent = (first, second)[sidecar]
            if lag:
                links[1 - sidecar].lag()
            path = f"/c{content}"
            try:
                if op == "upsert":
                    await sent.submit([record(names[which], revision=revision, upstream=UP, path_prefix=path)])
                else:
                    await sent.submit([], [Removal(refs[which], revision)])
            except StaleRevisionError:
                pass
            else:
                change: State = (revision, op == "remove", "" if op == "remove" else path)
                if stronger(change, highest.get(which)):
                    highest[which] = change
            for n, ref in enumerate(refs):
                value = etcd.value(LAYOUT.record_key(ref))
                held = decode_record(value) if value is not None else None
                got = None if held is None else (held.revision, held.removed, "" if held.removed else held.ingress.path_prefix)
                assert got == highest.get(n), f"after step {step} of {plan[: step + 1]}: ingress {n} holds {got}, wants {highest.get(n)}"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_etcd_holds_the_highest_acknowledged_change_of_every_ingress(plan: list[Step]) -> None:
    asyncio.run(scenario(plan))
