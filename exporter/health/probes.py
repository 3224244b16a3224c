"""Active probes: HTTP (method, path, headers, expected status, timeout) and TCP connect.

Like lua-resty-healthcheck, an HTTP probe opens a new connection, sends one request with
`Connection: close` and reads only the status line: a probe really reaches the server
(never a pooled keep-alive connection that outlived it), and costs a fraction of a full
HTTP client, so one daemon can probe thousands of targets per second.
"""

from __future__ import annotations

import asyncio
import ssl

from .checkers import CheckConfig, Node
from .state import Outcome

# Upstream certificates are not verified by probes: a probe checks liveness, not identity.
_TLS = ssl.create_default_context()
_TLS.check_hostname = False
_TLS.verify_mode = ssl.CERT_NONE


AGENT = "traefik-etcd-exporter-healthcheck"


def _request(node: Node, check: CheckConfig, agent: str) -> bytes:
    lines = [
        f"{check.method} {check.path} HTTP/1.1",
        f"Host: {node.ip}:{node.port}",
        f"User-Agent: {agent}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in check.headers),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def http_probe(node: Node, check: CheckConfig, agent: str = AGENT) -> Outcome:
    """Send the check request; success when the status is the expected one.

    `agent` is the User-Agent: the daemon's names the sidecar probing, so a server's log shows who probes it.
    """
    tls = _TLS if node.url.startswith("https://") else None
    writer = None
    try:
        async with asyncio.timeout(check.timeout):
            reader, writer = await asyncio.open_connection(node.ip, node.port, ssl=tls, server_hostname=node.ip if tls else None)
            writer.write(_request(node, check, agent))
            status_line = await reader.readline()
    except TimeoutError:
        return "timeout_failure"
    except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
        return "tcp_failure"
    finally:
        if writer is not None:
            writer.close()
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        return "http_failure"
    return "success" if int(parts[1]) == check.expected_status else "http_failure"


async def tcp_probe(node: Node, check: CheckConfig) -> Outcome:
    """Open (and close) a TCP connection to the node."""
    try:
        async with asyncio.timeout(check.timeout):
            _reader, writer = await asyncio.open_connection(node.ip, node.port)
    except TimeoutError:
        return "timeout_failure"
    except OSError:
        return "tcp_failure"
    writer.close()
    return "success"
