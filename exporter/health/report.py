"""What the health engine reports: `/v1/healthcheck` entries, the document the leader publishes.

Pure views over the engine's node states (the leader's own, or the published ones a
follower reads), so every sidecar answers the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..keys import IngressRef
from .checkers import CheckerTarget, Node, checker_entry, passive_entry
from .passive import PassiveHealth
from .state import NodeHealth


@dataclass
class Checked:
    """One checker target of an ingress: its node states, the task probing it, and which nodes it probes (None: all)."""

    target: CheckerTarget
    nodes: dict[str, NodeHealth]
    task: asyncio.Task[None] | None = None
    probed: tuple[Node, ...] | None = None

    def probed_nodes(self) -> tuple[Node, ...]:
        """The nodes this sidecar probes (with sharding on, its share)."""
        return self.target.nodes if self.probed is None else self.probed


def entries(owner: IngressRef, targets: Mapping[str, Checked], passive: PassiveHealth | None) -> list[dict[str, Any]]:
    """The `/v1/healthcheck` entries of one ingress from the leader's own states, ordered by name."""
    extra = partial(passive.node_entry, owner) if passive else None
    checked = sorted(targets.items())
    out = [checker_entry(name, c.target, c.nodes, extra) for name, c in checked]
    if extra is not None and passive is not None:
        covered = {url for _, c in checked for url in c.nodes}
        if rest := sorted(passive.urls(owner) - covered):
            out.append(passive_entry(f"{owner}/passive", rest, extra))
    return out


def published_entries(docs: Mapping[IngressRef, dict[str, Any]], owner: IngressRef | None) -> list[dict[str, Any]]:
    """The entries the leader published, for one ingress or all (what a follower reports)."""
    owners = [owner] if owner is not None else sorted(docs)
    return [entry for o in owners for entry in (docs.get(o) or {}).get("checkers", [])]


def document(owner: IngressRef, targets: Mapping[str, Checked], passive: PassiveHealth | None) -> dict[str, Any] | None:
    """What the leader publishes for one ingress (None: no checkers and no passive ejection)."""
    ejections = passive.published(owner) if passive else {}
    if not targets and not ejections:
        return None
    nodes = {
        url: {"status": health.state.value, "counter": health.counter()}
        for checked in targets.values()
        for url, health in checked.nodes.items()
    }
    return {"checkers": entries(owner, targets, passive), "nodes": nodes, **ejections}


def with_probers(
    found: list[dict[str, Any]], targets: Mapping[str, Checked], prober: Callable[[str, str], str | None]
) -> list[dict[str, Any]]:
    """The entries with each node naming the sidecar that probes it (copies: published documents stay as read)."""
    out = []
    for entry in found:
        checked = targets.get(entry.get("name", ""))
        if checked is None:
            out.append(entry)
            continue
        urls = {(n.ip, n.port): n.url for n in checked.target.nodes}
        nodes = [{**node, "prober": prober(checked.target.name, url)} if (url := urls.get((node.get("ip"), node.get("port")))) else node
                 for node in entry.get("nodes", [])]
        out.append({**entry, "nodes": nodes})
    return out
