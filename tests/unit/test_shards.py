"""Rendezvous hashing of nodes over the sidecars, and the state a sidecar publishes for the leader."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from exporter.config import Settings
from exporter.health.shards import Announcement, Members, node_key, owner
from exporter.health.state import NodeHealth, State

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
