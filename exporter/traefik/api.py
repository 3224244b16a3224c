"""A small client of Traefik's API: the beacon a root's snapshot carries, and the routers Traefik reports broken.

Every call is one small request whatever the number of routers (the broken-router lists are
one page each), so the observer's load on Traefik does not grow with the ingresses.
"""

from __future__ import annotations

import base64
from typing import Any

import aiohttp

from ..errors import TraefikUnreachable
from ..keys import BEACON_HEADER, BEACON_NAME
from ..metrics import Metrics

# One page of a list; a healthy Traefik has no broken router, so this is never the limit in practice.
_PAGE = 100


def basic_auth(username: str, password: str) -> str:
    """The `Authorization` value of HTTP basic auth."""
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


class TraefikApi:
    """Reads Traefik's API at `url` (e.g. `http://127.0.0.1:8080`), with basic auth when given."""

    def __init__(
        self, url: str, *, username: str | None = None, password: str | None = None, timeout: float = 2.0,
        metrics: Metrics | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Authorization": basic_auth(username, password or "")} if username else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._requests = (metrics or Metrics()).traefik_requests

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _get(self, path: str, what: str) -> Any:
        """The JSON at `path`, or None for 404; TraefikUnreachable for anything else that is not 200."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers)
        self._requests.labels(what).inc()
        try:
            async with self._session.get(self.url + path) as resp:
                if resp.status == 404:
                    return None
                if resp.status != 200:
                    raise TraefikUnreachable(f"Traefik's API at {self.url} answered HTTP {resp.status}")
                return await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            raise TraefikUnreachable(f"Traefik's API at {self.url} does not answer: {type(exc).__name__}") from None

    async def beacon(self) -> str | None:
        """The beacon value of the snapshot Traefik serves now (None: it serves no beacon)."""
        middleware = await self._get(f"/api/http/middlewares/{BEACON_NAME}@etcd", "beacon")
        headers = ((middleware or {}).get("headers") or {}).get("customRequestHeaders") or {}
        # Traefik's KV decoder may change the case of map keys.
        for name, value in headers.items():
            if name.lower() == BEACON_HEADER.lower():
                return str(value)
        return None

    async def broken_routers(self) -> list[dict[str, Any]]:
        """Routers from etcd that Traefik shows `disabled` or `warning` (http and tcp), with their errors.

        The overview's counters come first: while no router of any provider is broken, that is the only request.
        """
        overview = await self._get("/api/overview", "overview") or {}
        out: list[dict[str, Any]] = []
        for kind in ("http", "tcp"):
            counts = (overview.get(kind) or {}).get("routers") or {}
            for status, counter in (("disabled", "errors"), ("warning", "warnings")):
                if counts.get(counter, 1):
                    page = await self._get(f"/api/{kind}/routers?status={status}&per_page={_PAGE}", "routers")
                    out += [r for r in page or [] if r.get("provider") == "etcd"]
        return out
