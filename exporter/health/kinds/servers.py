"""`kind: servers`: one checker per upstream group over all its servers (when health_check.enable)."""

from __future__ import annotations

from ...ingress import HealthCheck, ServersUpstream
from ..checkers import CheckerTarget, Node, default_check


class ServersKind:
    kind = "servers"

    def targets(self, group: ServersUpstream, resource: str, defaults: HealthCheck, protocol: str = "http") -> list[CheckerTarget]:
        if not defaults.enable:
            return []
        nodes = tuple(Node(s.url) for s in group.servers)
        return [CheckerTarget(name=resource, nodes=nodes, check=default_check(defaults, protocol))]
