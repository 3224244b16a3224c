"""Pacing: the keys under a root are written at the pace its Traefik applies them.

Traefik rebuilds its whole configuration once per etcd revision under its root, at a cost
that grows with the root (docs/performance.md, "Large roots"). While it has not applied the
newest commit on a root (its beacon), writing more keys there only queues rebuilds nobody
needs. So while a root is behind, the rendered keys of its ingresses are held here; the
records of requests still commit at once (they live outside the roots: free for Traefik),
and everything held on a root is written together once Traefik has applied the previous
commit, or once the oldest of it has waited `hold_max` seconds (a Traefik that never applies
cannot hold writes forever).

Without a Traefik to ask (`behind` None) nothing is ever held.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..keys import IngressRef
from ..metrics import Sample


@dataclass(frozen=True)
class Backlog:
    """What is held on one root: how many ingresses, and how long the oldest has waited (seconds)."""

    ingresses: int
    oldest_seconds: float


class Pacer:
    """Holds the ingresses of roots whose Traefik is behind; says when they are due."""

    def __init__(
        self, behind: Callable[[str], bool] | None, hold_max: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._behind = behind
        self.hold_max = hold_max
        self._clock = clock
        # Per root: each held ingress with when it was first held (insertion order: oldest first)
        # and why its keys change (logged when they are written).
        self._held: dict[str, dict[IngressRef, tuple[float, str]]] = {}
        # Roots whose held keys are being written: everything else on them goes along.
        self._flushing: set[str] = set()
        # Roots that ever held keys: their gauge reads 0 when nothing waits, rather than vanishing.
        self._roots: set[str] = set()

    @property
    def enabled(self) -> bool:
        """True when there is a Traefik to pace to."""
        return self._behind is not None

    def paced(self, root: str) -> bool:
        """True when keys under `root` must wait: its Traefik is behind and nothing held there is overdue."""
        if self._behind is None or not root or root in self._flushing or not self._behind(root):
            return False
        return not self._overdue(root)

    def hold(self, ref: IngressRef, root: str, reason: str) -> None:
        """Keep `ref`'s keys back until its root is due (its first hold time and reason are kept)."""
        held = self._held.setdefault(root, {})
        if ref not in held:
            held[ref] = (self._clock(), reason)
            self._roots.add(root)

    def holds(self, ref: IngressRef) -> bool:
        """True when `ref`'s keys are held."""
        return any(ref in held for held in self._held.values())

    def ready(self) -> bool:
        """True when some root holds keys that may be written now."""
        return any(not self.paced(root) for root in self._held)

    def due(self) -> dict[IngressRef, str]:
        """Every held ingress of the roots that may be written now, with its reason; they are no longer held.

        Those roots stay unpaced until `flushed`, so whatever else is written with them goes whole.
        """
        out: dict[IngressRef, str] = {}
        for root in [r for r in self._held if not self.paced(r)]:
            out.update((ref, reason) for ref, (_at, reason) in self._held.pop(root).items())
            self._flushing.add(root)
        return out

    def flushing_roots(self) -> frozenset[str]:
        """The roots whose held keys are being written now."""
        return frozenset(self._flushing)

    def flushed(self) -> None:
        """The batch that wrote what was due is over."""
        self._flushing.clear()

    def release(self, refs: Iterable[IngressRef]) -> None:
        """Stop holding `refs` (their keys were written, or they are no longer wanted)."""
        if not self._held:
            return
        for ref in refs:
            for root, held in list(self._held.items()):
                if held.pop(ref, None) is not None and not held:
                    del self._held[root]

    def clear(self) -> None:
        """Forget everything held (leadership lost: the next leader renders whatever keys are missing)."""
        self._held.clear()

    def counts(self, roots: Iterable[str] = ()) -> list[Sample]:
        """Held ingresses per root (the paced-ingresses gauge, read at scrape): every root that ever
        held keys, and `roots` (those written to), so a root's series exists before its first hold."""
        return [((root,), float(len(self._held.get(root, ())))) for root in sorted(self._roots.union(roots))]

    def backlog(self, root: str) -> Backlog:
        """What is held on `root`."""
        held = self._held.get(root, {})
        oldest = next(iter(held.values()), None)
        return Backlog(len(held), round(self._clock() - oldest[0], 3) if oldest is not None else 0.0)

    def _overdue(self, root: str) -> bool:
        held = self._held.get(root)
        if not held:
            return False
        return self._clock() - next(iter(held.values()))[0] >= self.hold_max
