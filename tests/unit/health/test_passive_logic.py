"""Passive health without services: access-log lines, following the file, the ejection rules."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from exporter.health.accesslog import LogFollower, Request, classify
from exporter.health.checkers import load_kinds
from exporter.health.engine import HealthEngine
from exporter.health.kinds import BUILTIN
from exporter.health.passive import PassiveHealth, PassivePolicy
from exporter.health.passive_monitor import PassiveMonitor
from exporter.keys import IngressRef, KeyLayout
from exporter.roles import AlwaysLeader
from tests.helpers import ingress

STATUSES = frozenset({502, 503, 504})
A, B, C = "http://127.0.0.1:9001", "http://127.0.0.1:9002", "http://127.0.0.1:9003"
OWNER = IngressRef("test", "llm")


def line(service: str = "test_llm@etcd", url: str = A, origin: int | None = 200, downstream: int = 200, **extra: Any) -> bytes:
    """One access-log line as Traefik 3.7 writes it (fields it always sets, in its order)."""
    entry: dict[str, Any] = {"ClientHost": "127.0.0.1", "DownstreamStatus": downstream, "RetryAttempts": 0,
                             "RouterName": "test_llm@etcd", "ServiceAddr": url.split("//")[1], "ServiceName": service,
                             "ServiceURL": url, "level": "info", "msg": ""}
    if origin is not None:
        entry["OriginStatus"] = origin
    entry.update(extra)
    return json.dumps(entry).encode()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (line(origin=200), Request("test_llm", A, False)),
        (line(origin=502, downstream=502), Request("test_llm", A, True)),
        (line(origin=504, downstream=504), Request("test_llm", A, True)),
        (line(origin=500, downstream=500), Request("test_llm", A, False)),  # an application error is not a gateway failure
        (line(origin=0, downstream=502), Request("test_llm", A, True)),  # Traefik could not deliver it
        (line(origin=None, downstream=502), Request("test_llm", A, True)),
        (line(origin=None, downstream=499), Request("test_llm", A, False)),  # the client went away
        (line(service="test_llm@file"), None),  # not a service of the etcd provider
        (json.dumps({"DownstreamStatus": 404, "RouterName": ""}).encode(), None),  # no router matched
        (b'{"ServiceURL": broken', None),
        (b'["ServiceURL"]', None),
    ],
)
def test_each_line_is_classified_by_the_fields_traefik_writes(raw: bytes, expected: Request | None) -> None:
    assert classify(raw, STATUSES) == expected


def test_failure_statuses_are_configurable() -> None:
    assert classify(line(origin=500, downstream=500), frozenset({500})) == Request("test_llm", A, True)
    assert classify(line(origin=502, downstream=502), frozenset({500})) == Request("test_llm", A, False)


def test_the_follower_starts_at_the_end_and_reads_only_complete_new_lines(tmp_path: Path) -> None:
    log = tmp_path / "access.json"
    log.write_bytes(b"old 1\nold 2\n")
    follower = LogFollower(log)
    follower.open_at_end()
    assert follower.read_available() == []
    with log.open("ab") as f:
        f.write(b"new 1\nnew 2 begins")
    assert follower.read_available() == [b"new 1"]
    with log.open("ab") as f:
        f.write(b" and ends\n")
    assert follower.read_available() == [b"new 2 begins and ends"]
    follower.close()


def test_the_follower_follows_a_rotation_after_reading_the_old_file_to_its_end(tmp_path: Path) -> None:
    log = tmp_path / "access.json"
    log.write_bytes(b"")
    follower = LogFollower(log)
    follower.open_at_end()
    with log.open("ab") as f:
        f.write(b"a\n")
    assert follower.read_available() == [b"a"]
    with log.open("ab") as f:
        f.write(b"b\n")  # written before the rename, not read yet
    log.rename(tmp_path / "access.json.1")
    assert follower.read_available() == [b"b"]
    assert follower.read_available() == []  # renamed away, no new file yet: keep waiting
    log.write_bytes(b"c\nd\n")
    assert follower.read_available() == []  # end of the old file: notices the new one
    assert follower.read_available() == [b"c", b"d"]
    assert follower.rotations == 1
    follower.close()


def test_the_follower_reads_a_truncated_file_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "access.json"
    log.write_bytes(b"x" * 100 + b"\n")
    follower = LogFollower(log)
    follower.open_at_end()
    with log.open("r+b") as f:
        f.truncate(0)
    with log.open("ab") as f:
        f.write(b"after\n")
    assert follower.read_available() == []
    assert follower.read_available() == [b"after"]
    assert follower.truncations == 1
    follower.close()


def test_a_log_created_after_start_is_read_from_its_first_line(tmp_path: Path) -> None:
    log = tmp_path / "later.json"
    follower = LogFollower(log)
    follower.open_at_end()
    assert follower.read_available() == []
    log.write_bytes(b"first\n")
    assert follower.read_available() == [b"first"]
    follower.close()


@pytest.mark.parametrize(
    ("routable", "ejected", "percent", "allowed"),
    [(2, 0, 50, True), (2, 1, 50, False), (1, 0, 100, False), (3, 0, 50, True), (3, 1, 50, False),
     (3, 1, 100, True), (3, 2, 100, False), (10, 4, 50, True), (10, 5, 50, False), (4, 0, 0, False)],
)
def test_the_safety_rails(routable: int, ejected: int, percent: int, allowed: bool) -> None:
    assert PassivePolicy(max_ejection_percent=percent).may_eject(routable, ejected) is allowed


def test_consecutive_ejections_last_longer_up_to_the_maximum() -> None:
    policy = PassivePolicy(base_ejection_time=30, max_ejection_time=100)
    assert [policy.ejection_time(n) for n in (1, 2, 3, 4)] == [30, 60, 90, 100]


def passive(**policy: Any) -> PassiveHealth:
    return PassiveHealth(PassivePolicy(**policy), KeyLayout())


def fail(p: PassiveHealth, url: str, n: int, now: float = 100.0) -> None:
    p.observe([Request("test_llm", url, True)] * n, lambda owner: frozenset({A, B, C}), now)


LLM = ingress("llm", upstream={"servers": [{"url": A}, {"url": B}]})


def test_a_success_resets_the_run_and_failures_of_unknown_servers_are_ignored() -> None:
    p = passive()
    fail(p, A, 4)
    p.observe([Request("test_llm", A, False)], lambda owner: frozenset({A}), 101)
    fail(p, A, 2)
    p.observe([Request("test_other", A, True), Request("test_llm", "http://127.0.0.1:1", True)], lambda owner: frozenset(), 102)
    assert p.failures(OWNER, A) == 2
    assert list(p.decide(OWNER, LLM, frozenset(), 103)) == []


def test_a_group_of_two_never_loses_its_last_server() -> None:
    p = passive()
    fail(p, A, 5)
    fail(p, B, 5)
    ejected = list(p.decide(OWNER, LLM, frozenset(), 100))
    assert [url for _, url, _ in ejected] == [A]
    assert p.ejected(OWNER) == {A}
    assert p.failures(OWNER, B) == 5  # counted, but the rail holds


def test_a_server_the_probes_already_eject_does_not_count_as_routable() -> None:
    p = passive()
    fail(p, A, 5)
    assert list(p.decide(OWNER, LLM, frozenset({B}), 100)) == []  # A is the group's last routable server


def test_peers_runs_add_up_and_runs_from_before_an_ejection_do_not_count_again() -> None:
    p = passive(max_failures=5, base_ejection_time=10)
    fail(p, A, 2, now=100)
    p.set_peer("sidecar-2", [["test", "llm", A, 3, 99.0]])
    assert p.failures(OWNER, A) == 5
    assert [u for _, u, _ in p.decide(OWNER, LLM, frozenset(), 101)] == [A]
    assert p.failures(OWNER, A) == 0  # own run consumed; the peer's began before the ejection
    assert [o for o, _, _ in p.due(110.9)] == []
    assert [(o, u) for o, u, _ in p.due(111)] == [(OWNER, A)]
    p.release(OWNER, A, 111)
    p.set_peer("sidecar-2", [["test", "llm", A, 5, 112.0]])  # a new run after the return
    ejected = list(p.decide(OWNER, LLM, frozenset(), 113))
    assert [u for _, u, _ in ejected] == [A]
    assert p.ejections[OWNER][A].n == 2 and p.ejections[OWNER][A].until == 113 + 20  # consecutive: 2 x base
    assert p.set_peer("sidecar-2", None) == {OWNER}  # a dead sidecar's runs go with it
    assert p.failures(OWNER, A) == 0


def test_a_follower_drops_runs_the_leader_ejected_for_and_ignores_the_server_while_it_is_out() -> None:
    p = passive()
    fail(p, A, 3, now=100)
    assert p.follow_leader({OWNER: {"passive": {A: {"at": 99.0}}}}) is False  # that ejection came before this run
    assert p.follow_leader({OWNER: {"passive": {A: {"at": 101.0}}}}) is True
    assert p.report() == []
    fail(p, A, 3, now=102)  # requests sent before Traefik applied the ejection
    assert p.report() == []
    p.follow_leader({})  # it returned
    fail(p, A, 1, now=103)
    assert p.report() == [["test", "llm", A, 1, 103]]


def test_lines_logged_after_an_ejection_do_not_start_a_new_run() -> None:
    p = passive()
    fail(p, A, 5)
    assert len(list(p.decide(OWNER, LLM, frozenset(), 100))) == 1
    fail(p, A, 7, now=100.2)
    assert p.failures(OWNER, A) == 0


def test_a_new_leader_adopts_published_ejections() -> None:
    p = passive()
    fail(p, A, 5)
    list(p.decide(OWNER, LLM, frozenset(), 100))
    doc = p.published(OWNER)
    successor = passive()
    successor.adopt({OWNER: doc, IngressRef("test", "other"): {"nodes": {}}})
    assert successor.ejected(OWNER) == {A}
    assert successor.ejections[OWNER][A] == p.ejections[OWNER][A]


class _Replans:
    def __init__(self) -> None:
        self.refs: list[IngressRef] = []

    def mark_dirty(self, refs: Sequence[IngressRef], reason: str) -> None:
        self.refs.extend(refs)


def monitor(health_check: dict[str, Any] | None = None) -> tuple[PassiveMonitor, HealthEngine, _Replans]:
    replans = _Replans()
    engine = HealthEngine(load_kinds(BUILTIN), replans, passive=passive(base_ejection_time=10))
    fields: dict[str, Any] = {"upstream": {"servers": [{"url": A}, {"url": B}]}}
    if health_check is not None:
        fields["health_check"] = health_check
    checked = ingress("llm", **fields)
    engine.update(OWNER, checked)
    assert engine.passive is not None
    mon = PassiveMonitor(engine.passive, engine, AlwaysLeader(), ingress_of=lambda ref: checked,
                         follower=None, reports=None, clock=lambda: 100.0)
    return mon, engine, replans


def test_without_active_checks_a_server_returns_when_its_ejection_time_is_over() -> None:
    mon, _engine, replans = monitor()
    fail(mon.passive, A, 5)
    assert [u for _, u, _ in mon.passive.decide(OWNER, ingress("llm", upstream={"servers": [{"url": A}, {"url": B}]}), frozenset(),
                                                100)] == [A]
    mon.release_due(109.9)
    assert mon.passive.ejected(OWNER) == {A}
    mon.release_due(110)
    assert mon.passive.ejected(OWNER) == frozenset() and replans.refs == [OWNER]


def test_with_active_checks_a_server_returns_only_after_a_probe_passes_once_its_time_is_over() -> None:
    mon, engine, replans = monitor({"enable": True, "interval": 1, "max_retries": 3, "initial_delay": 0})
    node = engine.node(OWNER, A)
    assert node is not None
    node.success_at = 105.0  # a probe passed during the ejection: not enough
    fail(mon.passive, A, 5)
    list(mon.passive.decide(OWNER, ingress("llm", upstream={"servers": [{"url": A}, {"url": B}]}), frozenset(), 100))
    mon.release_due(110)
    mon.release_due(111)
    assert mon.passive.ejected(OWNER) == {A} and replans.refs == []
    node.success_at = 111.5  # the first probe after the ejection time passes
    mon.release_due(112)
    assert mon.passive.ejected(OWNER) == frozenset() and replans.refs == [OWNER]
