"""A checker plugin for `kind: tcp-connect` upstreams: one checker per server, probed by a TCP connect.

An ingress uses it with:

    upstream:
      kind: tcp-connect
      servers: [{url: "http://10.0.0.5:8000"}]
      config: {team: search}
"""

from __future__ import annotations

import asyncio

from exporter.plugin import CheckConfig, CheckerTarget, HealthCheck, Node, Outcome, PluginUpstream


async def connect(node: Node, check: CheckConfig) -> Outcome:
    """Success when a TCP connection opens within the check's timeout."""
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(node.ip, node.port), check.timeout)
    except TimeoutError:
        return "timeout_failure"
    except OSError:
        return "tcp_failure"
    writer.close()
    return "success"


class TcpConnectKind:
    """The `tcp-connect` kind."""

    kind = "tcp-connect"

    def targets(self, group: PluginUpstream, resource: str, defaults: HealthCheck, protocol: str = "http") -> list[CheckerTarget]:
        """One checker per server of the group, each probed by `connect`."""
        check = CheckConfig(
            type="tcp",
            interval=defaults.interval,
            timeout=defaults.max_wait_time,
            max_retries=defaults.max_retries,
            initial_delay=defaults.initial_delay,
        )
        return [
            CheckerTarget(
                name=f"{resource}/{n}",
                nodes=(Node(server.url),),
                check=check,
                plugin=self.kind,
                meta={"team": group.config.get("team", ""), "server": n},
                probe=connect,
            )
            for n, server in enumerate(group.servers)
        ]
