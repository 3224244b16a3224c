"""What the write loop is asked to do besides requests: re-plan ingresses (with why), full passes, re-lists.

Anything may ask (the health engine when a node changes routing, the mirror on drift, the
template watcher); only the loop takes. Built before its users, so the daemon wires the
health engine and the reconciler to the same inbox without either knowing the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from ..keys import IngressRef


class Inbox:
    """Dirty ingresses and pass requests, with one event that wakes the loop."""

    def __init__(self) -> None:
        self._dirty: dict[IngressRef, str] = {}
        self._wake = asyncio.Event()
        # The first pass of a new loop lists etcd and reconciles everything.
        self.full_requested = True
        self.relist_requested = True

    def mark_dirty(self, refs: Sequence[IngressRef], reason: str) -> None:
        """Re-plan these ingresses soon; `reason` (health, drift, ...) is logged with each change."""
        for ref in refs:
            self._dirty.setdefault(ref, reason)
        self._wake.set()

    def redo(self, reasons: Mapping[IngressRef, str]) -> None:
        """Plan these again on the next turn, each with its reason (a write that did not land, keys that were held)."""
        for ref, reason in reasons.items():
            self._dirty.setdefault(ref, reason)

    def request_full(self, relist: bool = False) -> None:
        """Ask for a full reconcile pass (and a re-list of etcd when `relist`)."""
        self.full_requested = True
        self.relist_requested = self.relist_requested or relist
        self._wake.set()

    def poke(self) -> None:
        """Wake the loop (a request was staged, or it should stop)."""
        self._wake.set()

    @property
    def dirty(self) -> bool:
        """True when ingresses wait to be re-planned."""
        return bool(self._dirty)

    def take_dirty(self) -> dict[IngressRef, str]:
        """Every dirty ingress with its reason; none are left."""
        dirty, self._dirty = self._dirty, {}
        return dirty

    async def wait(self, timeout: float) -> bool:
        """Until poked (True) or `timeout` seconds passed (False); the next wait blocks again."""
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def clear(self) -> None:
        """Forget the pokes seen so far (the loop is about to act on everything queued)."""
        self._wake.clear()
