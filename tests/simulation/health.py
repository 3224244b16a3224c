"""Health in the simulation: ejections and returns of one server of an ingress, interleaved with the
pushes. The verdicts are one truth every sidecar renders with (as followers render the leader's
published states); a change marks the ingress dirty on every sidecar that believes it leads, as
the health engine does on the leader. Once converged, every ingress's servers in etcd are its
record's minus the ejected one, read from etcd's keys alone."""

from __future__ import annotations

import random

from exporter.ingress import Ingress
from exporter.ingress.upstreams import ServersUpstream
from exporter.keys import IngressRef
from exporter.reconcile import Reconciler
from exporter.store.records import decode_record

SERVERS = ("http://10.0.0.5:8000", "http://10.0.0.6:8000")
EJECTABLE = SERVERS[1]  # the other keeps every ingress served


class Verdicts:
    """The routing verdicts (ejections) every sidecar renders with."""

    def __init__(self) -> None:
        self.out: dict[IngressRef, frozenset[str]] = {}
        self.changes = 0

    def ejected(self, ref: IngressRef, ingress: Ingress) -> frozenset[str]:
        return self.out.get(ref, frozenset())

    def flip(self, rng: random.Random, refs: list[IngressRef], leaders: list[Reconciler]) -> None:
        """Eject the ejectable server of one ingress, or return it; the believing leaders re-plan it."""
        ref = rng.choice(refs)
        self.out[ref] = frozenset() if self.out.get(ref) else frozenset({EJECTABLE})
        self.changes += 1
        for rec in leaders:
            rec.mark_dirty([ref], "health")

    def misrouted(self, keys: dict[str, str], root: str, records_dir: str) -> str:
        """The first live ingress whose servers in etcd are not its record's minus the ejected ("" when none);
        `records_dir` ends with "/"."""
        for key, value in sorted(keys.items()):
            if not key.startswith(records_dir) or (stored := decode_record(value)) is None or stored.removed:
                continue
            ref, upstream = stored.key, stored.ingress.upstream
            assert isinstance(upstream, ServersUpstream)  # the simulation pushes servers only
            wanted = sorted(s.url for s in upstream.servers if s.url not in self.out.get(ref, frozenset()))
            prefix = f"{root}/http/services/{ref.authority}_{ref.id}/loadBalancer/servers/"
            held = sorted(v for k, v in keys.items() if k.startswith(prefix) and k.endswith("/url"))
            if held != wanted:
                return f"{ref}: etcd routes to {held}, the verdict wants {wanted}"
        return ""
