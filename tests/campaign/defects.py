"""Planted defects: the daemon with one rule broken on purpose, to show that the campaign's checker
catches each (docs/campaign.md lists which rule catches which).

Usage (by the campaign's --defect): python -m tests.campaign.defects NAME run --config FILE

Each defect patches the running daemon before it starts; nothing of this is in the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import exporter.etcd.reach
import exporter.health.shared
import exporter.leader
import exporter.plan.guards
import exporter.reconcile.feed
import exporter.reconcile.judge
import exporter.reconcile.reconciler
import exporter.store.revisions
import exporter.write.packing
import exporter.write.writer
from exporter.cli import main
from exporter.errors import EtcdError, StaleRevisionError
from exporter.etcd.types import Compare, Op, TxnResult
from exporter.plan.plan import Change
from exporter.reconcile import Reconciler
from exporter.store.records import Record, Removal
from exporter.store.revisions import classify_upsert, tombstone_revision
from exporter.store.shared import SharedIndex


def _patch(owner: object, name: str, value: object) -> None:
    """Replace `owner.name`; fail loudly when it does not exist (a renamed target would plant nothing)."""
    if not hasattr(owner, name):
        raise SystemExit(f"planted defect: {getattr(owner, '__name__', owner)} has no {name!r}: the defect would plant nothing")
    setattr(owner, name, value)


_submit = Reconciler.submit
_pack = exporter.write.packing.pack
_order = exporter.plan.guards.order_changes
_kept: list[bytes] = []


def ack_without_commit() -> None:
    """Answers one upsert in ten 204 without writing it (rule 1)."""

    async def submit(self: Reconciler, upserts: Sequence[Record], removes: Sequence[Removal] = ()) -> None:
        if upserts and random.random() < 0.1:
            return
        await _submit(self, upserts, removes)

    _patch(Reconciler, "submit", submit)


def no_revision_check() -> None:
    """Applies every upsert whatever its revision, on arrival and at the plan (rules 1 and 3)."""

    def apply(_stored: Record | None, _incoming: Record) -> Literal["noop", "apply"]:
        return "apply"

    _patch(exporter.reconcile.reconciler, "classify_upsert", apply)
    _patch(exporter.reconcile.judge, "peer_verdict", lambda _wanted, _stored: None)


def refuse_newer() -> None:
    """Answers one newer upsert in ten 409 (rule 2)."""
    classify = classify_upsert

    def refusing(stored: Record | None, incoming: Record) -> Literal["noop", "apply"]:
        verdict = classify(stored, incoming)
        if verdict == "apply" and random.random() < 0.1:
            raise StaleRevisionError("planted", {"authority": incoming.key[0], "id": incoming.key[1], "stored_revision": 0})
        return verdict

    _patch(exporter.reconcile.reconciler, "classify_upsert", refusing)


def remove_noop_over_tombstone() -> None:
    """Answers a remove of an unknown or removed ingress as a no-op, whatever its revision: an older
    upsert sent after it brings the ingress back (rule 1)."""

    def noop(stored: Record | None, authority: str, ingress_id: str, revision: int | None) -> int | None:
        if stored is None or stored.removed:
            return None
        return tombstone_revision(stored, authority, ingress_id, revision)

    _patch(exporter.store.revisions, "tombstone_revision", noop)


def services_before_routers() -> None:
    """Deletes an object before the router that references it, in transactions of a few operations (rule 3)."""
    # Four operations a transaction (the settings allow no fewer than 8, and an ingress is 6 or 7):
    # an ingress is written in several, and the order of its changes shows.
    _patch(exporter.write.writer, "pack", lambda groups, _ops, size, shared=None: _pack(groups, 4, size, shared))

    def reversed_deletes(changes: list[Change]) -> list[Change]:
        ordered = _order(changes)
        deletes = [c for c in ordered if c.new is None]
        return [c for c in deletes if "/routers/" not in c.key] + [c for c in ordered if c.new is not None] + \
            [c for c in deletes if "/routers/" in c.key]

    _patch(exporter.plan.guards, "order_changes", reversed_deletes)


def keeps_keys() -> None:
    """Never deletes a key under a root (rules 4 and 5: a removed host is still served)."""

    def without_deletes(changes: list[Change]) -> list[Change]:
        return [c for c in _order(changes) if c.new is not None]

    _patch(exporter.plan.guards, "order_changes", without_deletes)


def every_one_leads() -> None:
    """Every sidecar says it leads (rule 6)."""
    set_leading = exporter.leader.Leadership._set
    campaign = exporter.leader.Leadership.run

    def leading(self: exporter.leader.Leadership, _leader: bool, why: str) -> None:
        set_leading(self, True, why)

    async def claiming(self: exporter.leader.Leadership) -> None:
        # A follower that never loses its lease would never call _set: each sidecar also claims
        # to lead 10 s after it starts (once the fleet came up with one leader, as set-up waits for).
        async def claim() -> None:
            await asyncio.sleep(10)
            set_leading(self, True, "planted: claims to lead")

        claimed = asyncio.create_task(claim())
        try:
            await campaign(self)
        finally:
            claimed.cancel()

    _patch(exporter.leader.Leadership, "_set", leading)
    _patch(exporter.leader.Leadership, "run", claiming)


def deletes_shared_in_use() -> None:
    """Takes every shared object for an orphan, so deletes those routers still name (rule 3)."""

    def orphans(self: SharedIndex, root: str | None = None) -> list[str]:
        return sorted(obj for obj in self.keys if root is None or obj.startswith(root + "/"))

    _patch(SharedIndex, "orphans", orphans)


def leaks() -> None:
    """Keeps 1 MiB per request forever (rule 7)."""

    async def submit(self: Reconciler, upserts: Sequence[Record], removes: Sequence[Removal] = ()) -> None:
        _kept.append(os.urandom(1024 * 1024))
        await _submit(self, upserts, removes)

    _patch(Reconciler, "submit", submit)


def ack_before_reply() -> None:
    """Answers a push 204 once its transaction has been sent for half a second, without its reply (rule 9)."""

    async def submit(self: Reconciler, upserts: Sequence[Record], removes: Sequence[Removal] = ()) -> None:
        task = asyncio.ensure_future(_submit(self, upserts, removes))
        done, _pending = await asyncio.wait({task}, timeout=0.5)
        if done:
            task.result()

    _patch(Reconciler, "submit", submit)


class _SpaceBlind:
    """The writer's etcd, taking a NOSPACE refusal of a transaction for its success, at the revision
    of its last commit (one the watch brings: etcd's current revision may be a write it never sees,
    which stalls the answer until the mirror lists again, past the alarm)."""

    def __init__(self, etcd: Any) -> None:
        self._etcd = etcd
        self._last = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._etcd, name)

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        try:
            result: TxnResult = await self._etcd.txn(compares, ops)
        except EtcdError as exc:
            if "space exceeded" not in exc.title or not self._last:
                raise
            return TxnResult(True, self._last)
        if result.succeeded:
            self._last = max(self._last, result.revision)
        return result


_writer_init = exporter.write.writer.Writer.__init__


def nospace_as_success() -> None:
    """The writer takes etcd's NOSPACE refusal of its transaction for its success (rules 1, 9).
    Only the writer's: a leader that believes it won an election etcd refused is another defect."""

    def init(self: exporter.write.writer.Writer, etcd: Any, *args: Any, **kwargs: Any) -> None:
        _writer_init(self, _SpaceBlind(etcd), *args, **kwargs)

    _patch(exporter.write.writer.Writer, "__init__", init)


_publisher = exporter.health.shared.SharedHealth.run_publisher


def deposed_leader_publishes() -> None:
    """On losing leadership, writes its health documents once more, unfenced, as a farewell (rule 11)."""

    async def run_publisher(self: exporter.health.shared.SharedHealth, document: exporter.health.shared.Document) -> None:
        async def farewell() -> None:
            docs = {self._layout.health_key(ref): json.dumps({**doc, "leader": self.identity, "at": time.time()})
                    for ref, doc in self.docs.items() if doc.get("leader") == self.identity}
            for _attempt in range(60):  # until etcd answers: a partitioned leader says goodbye after the heal
                with contextlib.suppress(EtcdError):
                    await self._etcd.txn([], [Op(key, value) for key, value in docs.items()])
                    return
                await asyncio.sleep(0.5)

        def changed(leading: bool) -> None:
            if not leading:
                _farewells.append(asyncio.ensure_future(farewell()))

        leadership = self._leader
        assert isinstance(leadership, exporter.leader.Leadership)
        leadership.add_listener(changed)
        await _publisher(self, document)

    _patch(exporter.health.shared.SharedHealth, "run_publisher", run_publisher)


_farewells: list[asyncio.Future[None]] = []
_feed_watch = exporter.reconcile.feed.Feed._watch


def watch_stops_when_broken() -> None:
    """A watch that breaks is not resumed: the mirror moves again only when it is listed (rules 12, 4: rule 12
    when a heal stands alone on its sidecar; when every reset overlaps another on the same sidecar, rule 12
    excuses them all, and the mirror that stopped after its last listing leaves the end state unconverged)."""

    async def watch(self: exporter.reconcile.feed.Feed, generation: int) -> None:
        broken = self._etcd.watch_prefix

        def once(*args: Any, **kwargs: Any) -> Any:
            async def events() -> Any:
                with contextlib.suppress(EtcdError):
                    async for batch in broken(*args, **kwargs):
                        yield batch
                await asyncio.Event().wait()  # never resumed

            return events()

        if not isinstance(self._etcd, _Watching):
            self._etcd = _Watching(self._etcd, once)
        await _feed_watch(self, generation)

    _patch(exporter.reconcile.feed.Feed, "_watch", watch)


class _Watching:
    """An etcd store whose `watch_prefix` is replaced."""

    def __init__(self, etcd: Any, watch_prefix: Callable[..., Any]) -> None:
        self._etcd, self.watch_prefix = etcd, watch_prefix

    def __getattr__(self, name: str) -> Any:
        return getattr(self._etcd, name)


def readiness_ignores_silence() -> None:
    """Counts etcd reachable until a request fails, however long it has been silent (rule 10)."""
    _patch(exporter.etcd.reach.Evidence, "reachability", lambda self: self._reachability)


DEFECTS: dict[str, Callable[[], Any]] = {
    "ack-without-commit": ack_without_commit,
    "no-revision-check": no_revision_check,
    "refuse-newer": refuse_newer,
    "remove-noop-over-tombstone": remove_noop_over_tombstone,
    "services-before-routers": services_before_routers,
    "keeps-keys": keeps_keys,
    "deletes-shared-in-use": deletes_shared_in_use,
    "every-one-leads": every_one_leads,
    "leaks": leaks,
    "ack-before-reply": ack_before_reply,
    "nospace-as-success": nospace_as_success,
    "deposed-leader-publishes": deposed_leader_publishes,
    "watch-stops-when-broken": watch_stops_when_broken,
    "readiness-ignores-silence": readiness_ignores_silence,
}


if __name__ == "__main__":
    DEFECTS[sys.argv[1]]()
    sys.argv = [sys.argv[0], *sys.argv[2:]]
    sys.exit(main())
