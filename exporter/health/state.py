"""The lua-resty-healthcheck state machine of one node (pure; no I/O).

States `healthy`, `mostly_healthy`, `mostly_unhealthy`, `unhealthy`; counters `success`,
`http_failure`, `tcp_failure`, `timeout_failure`. A success resets the failure counters, a
failure resets the success counter; reaching a threshold flips the state.

Routing (Backend.AI ModelHealthCheck meaning): a node is routed only in `healthy` or
`mostly_healthy`. A new node starts `mostly_unhealthy` with no success yet, so it gets no
traffic before its first successful probe; failures inside `initial_delay` are counted but
never make it `unhealthy`; after that, `max_retries` consecutive failures of one kind eject it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

Outcome = Literal["success", "http_failure", "tcp_failure", "timeout_failure"]


class State(str, Enum):  # noqa: UP042 - StrEnum would change how a state prints in logs
    HEALTHY = "healthy"
    MOSTLY_HEALTHY = "mostly_healthy"
    MOSTLY_UNHEALTHY = "mostly_unhealthy"
    UNHEALTHY = "unhealthy"


_COUNTERS = ("success", "http_failure", "tcp_failure", "timeout_failure")


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Consecutive results that flip the state."""

    successes: int = 1
    failures: int = 10
    initial_delay: float = 0.0


@dataclass(slots=True)
class NodeHealth:
    """One node's state, counters and history."""

    added_at: float
    state: State = State.MOSTLY_UNHEALTHY
    success: int = 0
    http_failure: int = 0
    tcp_failure: int = 0
    timeout_failure: int = 0
    # Wall-clock time of the last successful probe (a passive ejection that ended waits for one).
    success_at: float = 0.0
    # Wall-clock time and outcome of the last probe (what the status page shows).
    checked_at: float = 0.0
    last_outcome: str = ""
    # Adopted and not probed since: its next probe is reported whatever it finds. The state adopted
    # may be older than the verdict the leader gives by the time it reads on, and an owner that
    # reports only changes would never correct it.
    unreported: bool = False

    @property
    def routed(self) -> bool:
        """True when the load balancer may send traffic to this node."""
        return self.state in (State.HEALTHY, State.MOSTLY_HEALTHY)

    def adopt(self, published: dict[str, Any] | None, in_load_balancer: bool, grace_ended_at: float) -> None:
        """Continue from the state a previous leader published (no burst of spurious ejections).

        Not published yet (the old leader died right after a change): a server that is in the
        load balancer now stays there until probes say otherwise. Either way the grace period is over.
        """
        self.unreported = True
        if published is None:
            if in_load_balancer:
                self.state = State.HEALTHY
                self.added_at = min(self.added_at, grace_ended_at)
            return
        self.state = State(published["status"])
        for name, value in published.get("counter", {}).items():
            setattr(self, name, int(value))
        self.added_at = min(self.added_at, grace_ended_at)

    def observation(self) -> dict[str, Any]:
        """What the sidecar probing this node publishes for the leader (`take` reads it)."""
        return {"status": self.state.value, "counter": self.counter(), "checked_at": self.checked_at,
                "success_at": self.success_at, "last_outcome": self.last_outcome}

    def take(self, observed: dict[str, Any]) -> None:
        """Continue from the state the sidecar probing this node published (the leader, with sharding on)."""
        self.state = State(observed["status"])
        for name, value in observed.get("counter", {}).items():
            if name in _COUNTERS:
                setattr(self, name, int(value))
        self.checked_at = float(observed.get("checked_at", self.checked_at))
        self.success_at = float(observed.get("success_at", self.success_at))
        self.last_outcome = str(observed.get("last_outcome", self.last_outcome))

    def counter(self) -> dict[str, int]:
        """The counters in the /v1/healthcheck shape."""
        return {
            "success": self.success,
            "http_failure": self.http_failure,
            "tcp_failure": self.tcp_failure,
            "timeout_failure": self.timeout_failure,
        }

    def record(self, outcome: Outcome, now: float, limits: Thresholds) -> bool:
        """Apply one probe result; True when `routed` changed."""
        was_routed = self.routed
        if outcome == "success":
            self.http_failure = self.tcp_failure = self.timeout_failure = 0
            self.success += 1
            if self.success >= limits.successes:
                self.state = State.HEALTHY
            elif self.state is State.UNHEALTHY:
                self.state = State.MOSTLY_UNHEALTHY
        else:
            self.success = 0
            count = getattr(self, outcome) + 1
            setattr(self, outcome, count)
            in_grace = now - self.added_at < limits.initial_delay
            if count >= limits.failures and not in_grace:
                self.state = State.UNHEALTHY
            elif self.state is State.HEALTHY:
                self.state = State.MOSTLY_HEALTHY
        return self.routed != was_routed
