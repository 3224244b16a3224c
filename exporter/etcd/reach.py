"""What etcd's answers, or silence, say about it: shared by every transport of one client.

Every reply, watch message or failure updates it; readiness reads `reachability()`, also while
nothing is written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..errors import EtcdError


@dataclass(frozen=True)
class Reachability:
    """Whether etcd answered the last request (None: not asked yet), the failure if not, and since when (monotonic)."""

    reachable: bool | None
    error: str | None
    since: float


class Evidence:
    """The latest evidence of etcd's reachability, and when it last answered."""

    def __init__(self) -> None:
        self._reachability = Reachability(None, None, time.monotonic())
        self._last_answer = 0.0

    def reachability(self) -> Reachability:
        """What the last request said about etcd."""
        return self._reachability

    def idle_for(self) -> float:
        """Seconds since etcd last answered anything."""
        return time.monotonic() - self._last_answer

    def answered(self) -> None:
        """etcd answered (a reply or a watch message)."""
        self._last_answer = time.monotonic()
        if self._reachability.reachable is not True:
            self._reachability = Reachability(True, None, self._last_answer)

    def failed(self, error: EtcdError) -> EtcdError:
        """etcd could not be reached: recorded, and returned to raise."""
        if self._reachability.reachable is not False or self._reachability.error != error.title:
            since = self._reachability.since if self._reachability.reachable is False else time.monotonic()
            self._reachability = Reachability(False, error.title, since)
        return error
