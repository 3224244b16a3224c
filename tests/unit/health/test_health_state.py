"""The lua-resty-healthcheck state machine (pure): thresholds, counters, grace, routing."""

from __future__ import annotations

from exporter.health.state import NodeHealth, State, Thresholds

LIMITS = Thresholds(successes=1, failures=3, initial_delay=0)


def state(node: NodeHealth) -> State:
    """The node's state, read afresh (each record() may change it)."""
    return node.state


def test_a_new_node_is_not_routed_until_its_first_success() -> None:
    node = NodeHealth(added_at=0)
    assert state(node) is State.MOSTLY_UNHEALTHY and not node.routed
    assert node.record("success", 1, LIMITS) is True
    assert state(node) is State.HEALTHY and node.routed


def test_failures_degrade_then_eject_at_the_threshold_and_a_success_resets() -> None:
    node = NodeHealth(added_at=0)
    node.record("success", 1, LIMITS)
    assert node.record("http_failure", 2, LIMITS) is False
    assert state(node) is State.MOSTLY_HEALTHY and node.routed and node.success == 0
    node.record("http_failure", 3, LIMITS)
    assert node.record("http_failure", 4, LIMITS) is True
    assert state(node) is State.UNHEALTHY and not node.routed
    assert node.counter() == {"success": 0, "http_failure": 3, "tcp_failure": 0, "timeout_failure": 0}
    assert node.record("success", 5, LIMITS) is True
    assert node.counter() == {"success": 1, "http_failure": 0, "tcp_failure": 0, "timeout_failure": 0}


def test_each_failure_kind_counts_on_its_own() -> None:
    node = NodeHealth(added_at=0)
    node.record("success", 1, LIMITS)
    for outcome in ("http_failure", "tcp_failure", "timeout_failure", "http_failure", "tcp_failure"):
        node.record(outcome, 2, LIMITS)
    assert node.routed  # no kind reached 3 in a row
    node.record("timeout_failure", 3, LIMITS)
    assert node.record("timeout_failure", 4, LIMITS) is True and state(node) is State.UNHEALTHY


def test_failures_inside_the_initial_delay_never_eject() -> None:
    grace = Thresholds(successes=1, failures=2, initial_delay=60)
    node = NodeHealth(added_at=100)
    for t in range(101, 110):
        assert node.record("tcp_failure", t, grace) is False
    assert state(node) is State.MOSTLY_UNHEALTHY and node.tcp_failure == 9
    node.record("tcp_failure", 161, grace)  # grace is over: the threshold applies
    assert state(node) is State.UNHEALTHY


def test_more_successes_needed_pass_through_mostly_unhealthy() -> None:
    slow = Thresholds(successes=2, failures=1, initial_delay=0)
    node = NodeHealth(added_at=0)
    node.record("success", 1, slow)
    node.record("success", 2, slow)
    node.record("http_failure", 3, slow)
    assert state(node) is State.UNHEALTHY
    node.record("success", 4, slow)
    assert state(node) is State.MOSTLY_UNHEALTHY and not node.routed
    assert node.record("success", 5, slow) is True and state(node) is State.HEALTHY
