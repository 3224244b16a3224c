"""Rendezvous hashing of nodes over the sidecars, the state a sidecar publishes, and what the leader takes of it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from exporter.config import Settings
from exporter.etcd.types import WatchEvent
from exporter.health.sharding import Shards
from exporter.health.shards import Announcement, Members, node_key, owner
from exporter.health.state import NodeHealth, State
from exporter.keys import IngressRef
from exporter.metrics import Metrics
from tests.fake_etcd import FakeEtcd

NODES = [(f"a/i{n}/primary", f"http://127.0.0.1:{8000 + n % 7}") for n in range(3000)]


def owners(identities: list[str]) -> dict[tuple[str, str], str | None]:
    return {node: owner(identities, node_key(*node)) for node in NODES}


def test_a_sidecar_that_joins_takes_only_its_share_and_one_that_leaves_gives_up_only_its_own() -> None:
    three = owners(["a:1", "b:2", "c:3"])
    four = owners(["a:1", "b:2", "c:3", "d:4"])
    moved = [n for n in NODES if three[n] != four[n]]
    assert all(four[n] == "d:4" for n in moved)
    assert 0.2 < len(moved) / len(NODES) < 0.3  # a quarter, from every sidecar alike
    two = owners(["a:1", "c:3"])
    assert all(two[n] == three[n] for n in NODES if three[n] != "b:2")
    assert {two[n] for n in NODES if three[n] == "b:2"} == {"a:1", "c:3"}


def test_the_owner_does_not_depend_on_the_order_sidecars_are_seen_in() -> None:
    assert owners(["c:3", "a:1", "b:2"]) == owners(["a:1", "b:2", "c:3"])
    assert owner([], "k") is None


def test_members_count_themselves_once_announced_and_see_a_lease_change_as_a_change() -> None:
    members = Members()
    assert members.owner("t", "u") is None
    assert members.set("a:1", Announcement(7))
    assert members.owner("t", "u") == "a:1"
    assert not members.set("a:1", Announcement(7, ("a:1",)))  # a new view is no new member
    assert members.set("a:1", Announcement(8))
    assert members.set("a:1", None)
    assert members.owner("t", "u") is None


def test_nodes_two_sidecars_both_probe_are_counted_from_their_views() -> None:
    members = Members()
    members.set("a:1", Announcement(1, ("a:1", "b:2")))
    members.set("b:2", Announcement(2, ("a:1", "b:2")))
    assert members.probed_by_several(NODES) == 0
    # b has not seen a yet: it probes everything, a probes its half.
    members.set("b:2", Announcement(2, ("b:2",)))
    mine = sum(owner(["a:1", "b:2"], node_key(*n)) == "a:1" for n in NODES)
    assert members.probed_by_several(NODES) == mine > 0


def test_the_leader_takes_a_node_state_as_its_prober_published_it() -> None:
    probed = NodeHealth(added_at=0, state=State.MOSTLY_HEALTHY, success=0, http_failure=1, checked_at=5.0, last_outcome="http_failure")
    leader = NodeHealth(added_at=0, state=State.HEALTHY, success=4)
    leader.take(probed.observation())
    assert (leader.state, leader.counter(), leader.checked_at, leader.last_outcome) == (
        State.MOSTLY_HEALTHY, probed.counter(), 5.0, "http_failure")
    with pytest.raises(ValueError):
        leader.take({"status": "sideways"})


def test_sharding_needs_the_election_lease() -> None:
    with pytest.raises(ValidationError, match=r"health\.sharding"):
        Settings.model_validate({"health": {"sharding": "on"}, "leader": {"enabled": False}})
    assert Settings.model_validate({"health": {"sharding": "on"}}).health.sharding == "on"


class Engine:
    """What Shards asks of the health engine, recording the observations the leader takes."""

    def __init__(self, nodes: list[tuple[IngressRef, str, str]]) -> None:
        self._nodes, self.taken, self.adopted = nodes, [], []  # type: ignore[var-annotated]

    def nodes(self) -> Iterator[tuple[IngressRef, str, str]]:
        return iter(self._nodes)

    def reschedule(self) -> None:
        pass

    def adopt_node(self, ref: IngressRef, target: str, url: str) -> None:
        self.adopted.append((target, url))

    def observation(self, ref: IngressRef, owns: Callable[[str, str], bool]) -> dict[str, dict[str, dict[str, Any]]]:
        return {}

    def take_observation(self, ref: IngressRef, target: str, url: str, state: dict[str, Any], writer: str) -> None:
        self.taken.append((writer, target, url, state["status"]))

    def deciding(self) -> bool:
        return True

    def checked_at(self, ref: IngressRef, target: str, url: str) -> float:
        return 0.0


def _sharded(nodes: list[tuple[IngressRef, str, str]]) -> tuple[Shards, Engine]:
    layout = Settings.model_validate({}).layout()
    shards = Shards(FakeEtcd(), layout, "me:1", Metrics())
    engine = Engine(nodes)
    shards.engine = engine
    return shards, engine


def _announce(shards: Shards, identity: str, lease: int) -> None:
    shards._changed([WatchEvent.of(shards._layout.shard_key(identity), json.dumps({"lease": lease, "view": []}), 1)])


def _observe(shards: Shards, identity: str, lease: int, ref: IngressRef, target: str, url: str, status: str) -> None:
    doc = {"lease": lease, "targets": {target: {url: {"status": status}}}}
    shards._changed([WatchEvent.of(shards._layout.observation_key(identity, ref), json.dumps(doc), 1)])


def test_the_leader_takes_a_state_only_from_its_owner_under_the_lease_it_announced() -> None:
    ref = IngressRef("a", "i")
    nodes = [(ref, f"a/i/primary{n}", "http://10.0.0.5:80") for n in range(40)]
    shards, engine = _sharded(nodes)
    shards.lease_changed(9)
    _announce(shards, "me:1", 9)
    _announce(shards, "peer:2", 5)
    theirs = [(t, u) for _, t, u in nodes if shards.prober(t, u) == "peer:2"]
    mine = [(t, u) for _, t, u in nodes if shards.prober(t, u) == "me:1"]
    assert theirs and mine
    _observe(shards, "peer:2", 5, ref, *theirs[0], "unhealthy")
    _observe(shards, "peer:2", 5, ref, *mine[0], "unhealthy")  # not its node: no verdict
    _observe(shards, "peer:2", 4, ref, *theirs[1], "unhealthy")  # an expired lease: no verdict
    assert engine.taken == [("peer:2", *theirs[0], "unhealthy")]
    # Its lease gone, its nodes come to this sidecar, which continues from the published verdict.
    engine.adopted.clear()
    shards._changed([WatchEvent.of(shards._layout.shard_key("peer:2"), None, 1)])
    assert sorted(engine.adopted) == sorted(theirs)
    _observe(shards, "peer:2", 5, ref, *theirs[2], "unhealthy")
    assert len(engine.taken) == 1


def test_a_sidecar_counts_itself_only_under_the_lease_it_holds() -> None:
    shards, _engine = _sharded([(IngressRef("a", "i"), "a/i/primary", "http://10.0.0.5:80")])
    shards.lease_changed(9)
    _announce(shards, "me:1", 8)  # its announcement under the lease it held before
    assert not shards.owns("a/i/primary", "http://10.0.0.5:80")
    _announce(shards, "me:1", 9)
    assert shards.owns("a/i/primary", "http://10.0.0.5:80")
    shards.lease_changed(10)
    assert not shards.owns("a/i/primary", "http://10.0.0.5:80")
