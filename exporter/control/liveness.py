"""`traefik-etcd-exporter healthcheck`: is the daemon this config describes alive? (a container's HEALTHCHECK)

It asks the control server the config names (`control.listen`, HTTPS when `control.tls_cert_file`
is set) for `/healthz`. Exit 0 when it answers 200, 1 otherwise. The check runs beside the daemon
and reaches it on loopback, so it does not verify the control server's certificate: what it tests
is that the daemon answers, not who it is.
"""

from __future__ import annotations

import asyncio

import aiohttp

from ..config import Settings
from .status_client import control_url

EXIT_ALIVE, EXIT_DEAD = 0, 1


async def _probe(url: str, timeout: float) -> int:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session, \
            session.get(f"{url}/healthz", ssl=False) as resp:
        return resp.status


def healthcheck(settings: Settings, timeout: float = 3.0) -> tuple[int, str]:
    """The exit code and the one line `healthcheck` prints."""
    url = control_url(settings)
    try:
        status = asyncio.run(_probe(url, timeout))
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        return EXIT_DEAD, f"unhealthy: {url}/healthz does not answer ({type(exc).__name__})\n"
    if status != 200:
        return EXIT_DEAD, f"unhealthy: {url}/healthz answered {status}\n"
    return EXIT_ALIVE, f"healthy: {url}/healthz answered 200\n"
