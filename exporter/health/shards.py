"""Who probes what: the live sidecars and rendezvous hashing of each node over them (pure; no I/O).

A node (one server of one checker target) belongs to the live sidecar with the highest weight
`blake2b(identity, target, url)`. A sidecar that joins takes only the nodes it now weighs most
for; one that leaves gives up only its own, each to its next sidecar in that node's order.
Every sidecar sees the same announcements in etcd's revision order, so they agree on the owner
of every node once they have read the same revision.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass


def node_key(target: str, url: str) -> str:
    """The identity a node is hashed by: its checker target (ingress and upstream group) and its server URL."""
    return f"{target}\0{url}"


def weight(identity: str, key: str) -> int:
    """The rendezvous weight of `key` on sidecar `identity` (stable across processes and versions)."""
    return int.from_bytes(hashlib.blake2b(f"{identity}\0{key}".encode(), digest_size=8).digest(), "big")


def owner(identities: Iterable[str], key: str) -> str | None:
    """The sidecar that probes `key` among `identities` (None: no sidecar is live)."""
    best: tuple[int, str] | None = None
    for identity in identities:
        candidate = (weight(identity, key), identity)
        if best is None or candidate > best:
            best = candidate
    return best[1] if best is not None else None


@dataclass(frozen=True, slots=True)
class Announcement:
    """A live sidecar: the lease its keys are on, and the sidecars it sees (its view)."""

    lease: int
    view: tuple[str, ...] = ()


class Members:
    """The announced sidecars and the owner of each node among them (cached until they change)."""

    def __init__(self) -> None:
        self.live: dict[str, Announcement] = {}
        self._owners: dict[str, str | None] = {}

    def identities(self) -> tuple[str, ...]:
        """The live sidecars, sorted (what a sidecar announces as its view)."""
        return tuple(sorted(self.live))

    def set(self, identity: str, announcement: Announcement | None) -> bool:
        """Record an announcement (None: gone); True when the set of live sidecars or their leases changed."""
        before = self.live.get(identity)
        if announcement is None:
            self.live.pop(identity, None)
        else:
            self.live[identity] = announcement
        changed = (before is None) != (announcement is None) or (
            before is not None and announcement is not None and before.lease != announcement.lease
        )
        if changed:
            self._owners.clear()
        return changed

    def owner(self, target: str, url: str) -> str | None:
        """The sidecar probing one node now."""
        key = node_key(target, url)
        if key not in self._owners:
            self._owners[key] = owner(self.live, key)
        return self._owners[key]

    def forget(self, target: str, url: str) -> None:
        """A node is gone: drop its cached owner."""
        self._owners.pop(node_key(target, url), None)

    def shares(self, nodes: Iterable[tuple[str, str]]) -> dict[str, int]:
        """How many of `nodes` each live sidecar probes."""
        counts = dict.fromkeys(self.live, 0)
        for target, url in nodes:
            if (who := self.owner(target, url)) is not None:
                counts[who] += 1
        return counts

    def probed_by_several(self, nodes: Iterable[tuple[str, str]]) -> int:
        """How many of `nodes` more than one live sidecar probes, each by the owners its own announced view gives."""
        views = {a.view for a in self.live.values()}
        if len(views) <= 1:
            return 0
        count = 0
        for target, url in nodes:
            key = node_key(target, url)
            count += sum(owner(a.view, key) == identity for identity, a in self.live.items()) > 1
        return count
