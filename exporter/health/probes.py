"""Active probes: HTTP (method, path, headers, expected status, timeout) and TCP connect.

One shared aiohttp session whose connector closes every connection after use: a probe must
really reach the server, never ride a pooled keep-alive connection that outlived it.
"""

from __future__ import annotations

import asyncio

import aiohttp

from .checkers import CheckConfig, Node
from .state import Outcome


def probe_session(limit: int) -> aiohttp.ClientSession:
    """The session every HTTP probe shares."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True, limit=limit, ssl=False),
        auto_decompress=False,
    )


async def http_probe(session: aiohttp.ClientSession, node: Node, check: CheckConfig) -> Outcome:
    """GET (or `check.method`) the check path; success when the status is the expected one."""
    url = node.url.rstrip("/") + check.path
    try:
        async with session.request(
            check.method, url, headers=dict(check.headers), timeout=aiohttp.ClientTimeout(total=check.timeout),
            allow_redirects=False,
        ) as resp:
            return "success" if resp.status == check.expected_status else "http_failure"
    except asyncio.TimeoutError:
        return "timeout_failure"
    except (aiohttp.ClientError, OSError):
        return "tcp_failure"


async def tcp_probe(node: Node, check: CheckConfig) -> Outcome:
    """Open (and close) a TCP connection to the node."""
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(node.ip, node.port), check.timeout)
    except asyncio.TimeoutError:
        return "timeout_failure"
    except OSError:
        return "tcp_failure"
    writer.close()
    return "success"
