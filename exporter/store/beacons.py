"""The values each root's beacon held, newest last: what maps a lagging Traefik's shown beacon to a revision."""

from __future__ import annotations

import time
from collections import defaultdict, deque
from dataclasses import dataclass

# Beacon values remembered per root: enough to map what a lagging Traefik shows to a revision.
_BEACON_HISTORY = 4096


@dataclass(frozen=True, slots=True)
class BeaconWrite:
    """One value a root's beacon held: written at `revision`, seen here at `seen_at` (monotonic)."""

    value: str
    revision: int
    seen_at: float


class Beacons:
    """Per root, the beacon values seen in etcd (bounded), each with the revision that wrote it."""

    def __init__(self) -> None:
        self._history: dict[str, deque[BeaconWrite]] = defaultdict(lambda: deque(maxlen=_BEACON_HISTORY))

    def written(self, root: str, value: str, revision: int) -> None:
        """A beacon value seen at `revision` (an older or repeated revision is ignored)."""
        history = self._history[root]
        if not history or history[-1].revision < revision:
            history.append(BeaconWrite(value, revision, time.monotonic()))

    def latest(self, root: str) -> BeaconWrite | None:
        """The value `root`'s beacon holds now (None: it has none)."""
        history = self._history.get(root)
        return history[-1] if history else None

    def history(self, root: str) -> list[BeaconWrite]:
        """The values `root`'s beacon held, oldest first (the last one is current)."""
        return list(self._history.get(root, ()))
