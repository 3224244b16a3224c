"""What etcd's answers, or silence, say about it: shared by every transport of one client.

Every reply or failure updates it; readiness reads `reachability()`, also while nothing is
written (the daemon asks etcd whenever it has been quiet). Watch messages are no evidence: a
watch keeps streaming through a link that carries nothing the other way, and one on a member cut
off from its peers goes quiet rather than failing. So etcd that answered before and has answered
nothing for `silent_after` seconds, though asked, is unreachable without waiting for a timeout.
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
        self.silent_after: float | None = None  # set by whoever asks etcd while idle

    def reachability(self) -> Reachability:
        """What the last request said about etcd, or its silence since."""
        idle = self.idle_for()
        if self._reachability.reachable and self.silent_after is not None and idle > self.silent_after:
            return Reachability(False, f"no answer for {idle:.1f}s (asked every second)", self._last_answer)
        return self._reachability

    def idle_for(self) -> float:
        """Seconds since etcd last answered anything."""
        return time.monotonic() - self._last_answer

    def answered(self) -> None:
        """etcd answered a request."""
        self._last_answer = time.monotonic()
        if self._reachability.reachable is not True:
            self._reachability = Reachability(True, None, self._last_answer)

    def failed(self, error: EtcdError) -> EtcdError:
        """etcd could not be reached: recorded, and returned to raise."""
        if self._reachability.reachable is not False or self._reachability.error != error.title:
            since = self._reachability.since if self._reachability.reachable is False else time.monotonic()
            self._reachability = Reachability(False, error.title, since)
        return error
