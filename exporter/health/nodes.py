"""Node states of every checked ingress, and what is read from them: ejections, documents, reports, observations.

The base of the health engine (which adds probing): on the deciding exporter these are its own
states, on a follower the reads go to the documents the leader published, so every sidecar answers the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from loguru import logger

from ..ingress import Ingress
from ..keys import IngressRef
from ..metrics import Sample
from . import report
from .checkers import CheckerKind, CheckerTarget, targets_of
from .passive import PassiveHealth
from .sharding import Shards
from .shared import SharedHealth
from .state import NodeHealth, State


class NodeStates:
    """The node states and every view of them; `ejected()` is what rendering leaves out."""

    kinds: dict[str, CheckerKind]
    passive: PassiveHealth | None
    _checked: dict[IngressRef, dict[str, report.Checked]]
    _clock: Callable[[], float]
    _deciding: bool
    _shards: Shards | None
    _shared: SharedHealth | None
    _rendered_urls: Callable[[IngressRef], frozenset[str]] | None

    def checked_at(self, owner: IngressRef, name: str, url: str) -> float:
        """When the probe behind this engine's state of a node ran (wall clock; 0: never)."""
        checked = self._checked.get(owner, {}).get(name)
        health = checked.nodes.get(url) if checked is not None else None
        return health.checked_at if health is not None else 0.0

    def _route(self, owner: IngressRef, url: str, health: NodeHealth, reason: str) -> None:
        raise NotImplementedError

    def targets_of(self, ingress: Ingress) -> list[CheckerTarget]:
        """The checker targets an ingress declares through its upstream kinds."""
        return targets_of(self.kinds, ingress)

    def ejected(self, owner: IngressRef, ingress: Ingress) -> frozenset[str]:
        """URLs that must not receive traffic: nodes not routed, and checked nodes not probed yet.

        An exporter that is not probing (a follower) uses the states the leader published.
        """
        if (shared := self._followed()) is not None:
            doc = shared.docs.get(owner) or {}
            published = doc.get("nodes", {})
            out = set(doc.get("passive", ()))
            for target in self.targets_of(ingress):
                for node in target.nodes:
                    if published.get(node.url, {}).get("status") not in (State.HEALTHY.value, State.MOSTLY_HEALTHY.value):
                        out.add(node.url)
            return frozenset(out)
        return self.active_ejected(owner, ingress) | (self.passive.ejected(owner) if self.passive else frozenset())

    def active_ejected(self, owner: IngressRef, ingress: Ingress) -> frozenset[str]:
        """What the probes alone keep out (the leader's own states)."""
        out: set[str] = set()
        known = self._checked.get(owner, {})
        for target in self.targets_of(ingress):
            checked = known.get(target.name)
            for node in target.nodes:
                health = checked.nodes.get(node.url) if checked else None
                if health is None or not health.routed:
                    out.add(node.url)
        return frozenset(out)

    def deciding(self) -> bool:
        """True when this engine's states are the verdict (the leader, or the only exporter)."""
        return self._deciding

    def _adopt_published(self) -> None:
        # A new leader continues from its predecessor's states: no burst of spurious ejections.
        if self._shared is None:
            return
        if self.passive is not None:
            self.passive.adopt(self._shared.docs)
        for owner, name, url in list(self.nodes()):
            if self._shards is None or not self._shards.owns(name, url):  # what it probes itself is current
                self.adopt_node(owner, name, url)

    def document(self, owner: IngressRef) -> dict[str, Any] | None:
        """What the leader publishes for one ingress (None: no checkers and no passive ejection)."""
        return report.document(owner, self._checked.get(owner, {}), self.passive)

    def node(self, owner: IngressRef, url: str) -> NodeHealth | None:
        """The probed state of one server of `owner` (None: no active check covers it)."""
        for checked in self._checked.get(owner, {}).values():
            if url in checked.nodes:
                return checked.nodes[url]
        return None

    def probe_passed_since(self, owner: IngressRef, url: str, since: float) -> bool:
        """True when a probe of this server passed after `since` (wall clock): what a passive ejection waits for.

        A node another sidecar probes is published only when its state changes: healthy there means its probes pass.
        """
        node = self.node(owner, url)
        if node is None:
            return True
        if self._shards is not None and not any(self._shards.owns(name, url) for name in self._checked.get(owner, {})):
            return node.state is State.HEALTHY
        return node.success_at > since

    def nodes(self) -> Iterator[tuple[IngressRef, str, str]]:
        """Every checked node: (ingress, target name, url)."""
        for owner, targets in self._checked.items():
            for name, checked in targets.items():
                for url in checked.nodes:
                    yield owner, name, url

    def adopt_node(self, owner: IngressRef, name: str, url: str) -> None:
        """Continue a node from the published verdict (a new leader, or a node this sidecar now probes: no spurious ejection)."""
        checked = self._checked.get(owner, {}).get(name)
        if checked is None or url not in checked.nodes or self._shared is None:
            return
        published = (self._shared.docs.get(owner) or {}).get("nodes", {})
        rendered = self._rendered_urls(owner) if self._rendered_urls is not None else frozenset()
        checked.nodes[url].adopt(published.get(url), url in rendered, self._clock() - checked.target.check.initial_delay)

    def observation(self, owner: IngressRef, owns: Callable[[str, str], bool]) -> dict[str, dict[str, dict[str, Any]]]:
        """The states of the nodes of `owner` that `owns`, by target and url (what a sidecar publishes)."""
        out = {}
        for name, checked in self._checked.get(owner, {}).items():
            if nodes := {url: health.observation() for url, health in checked.nodes.items() if owns(name, url)}:
                out[name] = nodes
        return out

    def take_observation(self, owner: IngressRef, name: str, url: str, state: dict[str, Any], writer: str) -> None:
        """The leader takes a node's state from the sidecar probing it; a routing change is planned as a probe's is."""
        checked = self._checked.get(owner, {}).get(name)
        health = checked.nodes.get(url) if checked is not None else None
        if health is None or not self._deciding:
            return
        routed = health.routed
        try:
            health.take(state)
        except (KeyError, TypeError, ValueError):
            logger.error("ignoring the malformed observation of {} {} by {}", name, url, writer)
            return
        if health.routed != routed:
            logger.info("health: {} {} is now {} ({}, probed by {})", name, url, health.state.value, health.last_outcome, writer)
            self._route(owner, url, health, f"active: {health.last_outcome}")

    def state_counts(self) -> list[Sample]:
        """Checked nodes per state, from the published states on a follower (the gauge, read at scrape)."""
        if (shared := self._followed()) is not None:
            states: Iterable[State] = (State(n["status"]) for d in shared.docs.values() for n in d.get("nodes", {}).values())
        else:
            states = (h.state for t in self._checked.values() for c in t.values() for h in c.nodes.values())
        counts = dict.fromkeys(State, 0)
        for state in states:
            counts[state] += 1
        return [((state.value,), float(count)) for state, count in counts.items()]

    def _followed(self) -> SharedHealth | None:
        # Not deciding, with a leader to read from: report and render the published states.
        return self._shared if not self._deciding else None

    def checkers(self, owner: IngressRef | None = None) -> list[dict[str, Any]]:
        """Checker entries in the APISIX /v1/healthcheck shape, ordered by name.

        A follower reports what the leader published, so every exporter answers the same.
        With sharding on, each node names the sidecar probing it (`prober`).
        """
        shared = self._followed()
        known = set(shared.docs) if shared is not None else set(self._checked) | (self.passive.owners() if self.passive else set())
        out = []
        for o in [owner] if owner is not None else sorted(known):
            mine = self._checked.get(o, {})
            found = report.published_entries(shared.docs, o) if shared is not None else report.entries(o, mine, self.passive)
            out += report.with_probers(found, mine, self._shards.prober) if self._shards is not None else found
        return out
