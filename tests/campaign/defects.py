"""Planted defects: the daemon with one rule broken on purpose, to show that the campaign's checker
catches each (docs/campaign.md lists which rule catches which).

Usage (by the campaign's --defect): python -m tests.campaign.defects NAME run --config FILE

Each defect patches the running daemon before it starts; nothing of this is in the daemon.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from collections.abc import Callable, Sequence
from typing import Any, Literal

import exporter.leader
import exporter.plan.guards
import exporter.reconcile.judge
import exporter.reconcile.reconciler
import exporter.store.revisions
import exporter.write.packing
import exporter.write.writer
from exporter.cli import main
from exporter.errors import StaleRevisionError
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
}


if __name__ == "__main__":
    DEFECTS[sys.argv[1]]()
    sys.argv = [sys.argv[0], *sys.argv[2:]]
    sys.exit(main())
