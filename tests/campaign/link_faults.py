"""The campaign's faults of the network, through the links (link.py): a sidecar partitioned from
all of etcd (cut, reset, or one way), its connections reset once, a sidecar cut from one member only, the raft leader cut
from its peers while its clients still reach it, and latency on one link."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .link import BOTH, DOWN, UP, Link
from .world import LEADER_TTL, Sidecar

if TYPE_CHECKING:
    from .faults import Faults

MODES = {"cut": BOTH, "cut up": frozenset({UP}), "cut down": frozenset({DOWN})}  # up: toward etcd


def _impair(link: Link, mode: str) -> None:
    if mode == "drop":
        link.drop()
    else:
        link.partition(MODES[mode])


async def partition(f: Faults) -> None:
    """Every link of one sidecar cut both ways, reset, or cut one way, for 1 s to TTL + 4 s."""
    mode = f.rng.choices(["cut", "drop", "cut up", "cut down"], [5, 2, 1.5, 1.5])[0]

    async def cut(s: Sidecar) -> None:
        for link in s.links:
            _impair(link, mode)

    async def heal(s: Sidecar) -> None:
        for link in s.links:
            link.heal()

    await f.on_sidecar("partition", await f.pick_sidecar(), cut, heal, f.rng.uniform(1, LEADER_TTL + 4), mode)


async def reset(f: Faults) -> None:
    """Every connection of one sidecar to etcd reset once; held 0.5-3 s, for the sidecar to resume its streams."""

    async def cut(s: Sidecar) -> None:
        for link in s.links:
            link.reset()

    async def nothing(s: Sidecar) -> None:
        return None

    await f.on_sidecar("reset", await f.pick_sidecar(), cut, nothing, f.rng.uniform(0.5, 3))


async def member_cut(f: Faults) -> None:
    """One sidecar's link to one member cut (or reset) for 1-8 s: its client must move to another member."""
    index = f.rng.randrange(len(f.world.members))
    mode = f.rng.choice(["cut", "drop"])

    async def cut(s: Sidecar) -> None:
        _impair(s.links[index], mode)

    async def heal(s: Sidecar) -> None:
        s.links[index].heal()

    await f.on_sidecar("member-cut", await f.pick_sidecar(), cut, heal, f.rng.uniform(1, 8), f"{mode} member {index}")


async def leader_isolate(f: Faults) -> None:
    """The raft leader cut from its peers, both ways, for 1-6 s, while every sidecar still reaches it:
    it steps down, and what reaches it hangs or fails until it has."""
    if f.member.locked() or (leader := f.world.raft_leader()) is None:
        f.skipped["leader-isolate"] += 1
        return
    async with f.member:
        index = f.world.members.index(leader)
        links = f.world.peer_links
        start = f.now()
        links[index].partition()
        for other in (link for n, link in enumerate(links) if n != index):
            other.isolate(f.world.member_ids[index])
        try:
            await f.hold(f.rng.uniform(1, 6))
        finally:
            for link in links:
                link.heal()
            await f.record("leader-isolate", str(leader.client_port), start)


async def latency(f: Faults) -> None:
    """0.2-2 s of latency, each way or one way, for 2-8 s: on one link of a sidecar (70 %) or on a
    member's peer link (slow raft to one member)."""
    seconds = round(f.rng.uniform(0.2, 2), 2)
    way = f.rng.choice(["both", UP, DOWN])
    directions = BOTH if way == "both" else frozenset({way})
    if f.rng.random() < 0.7:
        index = f.rng.randrange(len(f.world.members))

        async def slow(s: Sidecar) -> None:
            s.links[index].delay(seconds, directions)

        async def heal(s: Sidecar) -> None:
            s.links[index].heal()

        await f.on_sidecar("latency", await f.pick_sidecar(), slow, heal, f.rng.uniform(2, 8), f"{seconds}s {way} member {index}")
        return
    if f.member.locked():
        f.skipped["latency"] += 1
        return
    async with f.member:
        index = f.rng.randrange(len(f.world.members))
        link = f.world.peer_links[index]
        start = f.now()
        link.delay(seconds, directions)
        try:
            await f.hold(f.rng.uniform(2, 6))
        finally:
            link.heal()
            await f.record("latency", f"peers of {f.world.members[index].client_port}", start, f"{seconds}s {way}")
