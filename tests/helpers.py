"""Test helpers: polling with a deadline, ingress builders, real HTTP backends."""

from __future__ import annotations

import asyncio
import ssl
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web

from exporter.embedded import free_port
from exporter.ingress import Ingress
from exporter.store.records import Record

T = TypeVar("T")
AUTHORITY = "test"


async def eventually(check: Callable[[], Awaitable[T]], timeout: float = 15.0, interval: float = 0.05) -> T:
    """Poll `check` until it returns a truthy value without raising; fail with its last error."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            result = await check()
            if result:
                return result
            last = AssertionError(f"check returned {result!r}")
        except (AssertionError, OSError, asyncio.TimeoutError, KeyError, ValueError) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout}s: {last!r}")
        await asyncio.sleep(interval)


def poll_until(check: Callable[[], bool], timeout: float, interval: float = 0.2) -> None:
    """Synchronous `eventually`: call `check` until it returns True or raise at the deadline."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (AssertionError, OSError) as exc:
            last = exc
        time.sleep(interval)
    raise AssertionError(f"condition not met in {timeout}s: {last!r}")


def uid(prefix: str = "t") -> str:
    """A unique DNS label for test isolation."""
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def ingress(ingress_id: str, **fields: Any) -> Ingress:
    """An ingress of the test authority; host defaults to `<id>.test`."""
    data: dict[str, Any] = {"authority": AUTHORITY, "id": ingress_id, "revision": 1, "hosts": [f"{ingress_id}.test"]}
    data.update(fields)
    return Ingress.model_validate(data)


def ingress_yaml(iid: str, revision: int, port: int, authority: str = AUTHORITY) -> str:
    """An ingress file with one ingress of `iid` routed to 127.0.0.1:`port`."""
    return (
        "ingresses:\n"
        f"  - authority: {authority}\n    id: {iid}\n    revision: {revision}\n    hosts: [{iid}.test]\n"
        f'    upstream: {{servers: [{{url: "http://127.0.0.1:{port}"}}]}}\n'
    )


def record(ingress_id: str, **fields: Any) -> Record:
    """A record of `ingress(...)`."""
    return Record.of(ingress(ingress_id, **fields))


@dataclass
class Backend:
    """A real HTTP server on 127.0.0.1 answering its name; counts hits; can die and come back."""

    name: str
    port: int = field(default_factory=free_port)
    status: int = 200
    health: int = 200  # what /health answers
    hits: Counter[str] = field(default_factory=Counter)
    ssl_context: ssl.SSLContext | None = None
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    async def start(self) -> Backend:
        async def handle(request: web.Request) -> web.Response:
            self.hits[request.path] += 1
            status = self.health if request.path == "/health" else self.status
            return web.Response(text=self.name, status=status)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self.ssl_context).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def get_via(session: Any, base_url: str, host: str, path: str = "/", **kwargs: Any) -> tuple[int, str]:
    """One request through Traefik with the given Host header."""
    async with session.get(base_url + path, headers={"Host": host}, **kwargs) as resp:
        return resp.status, await resp.text()


async def traefik_object(session: Any, api_url: str, kind: str, name: str) -> dict[str, Any] | None:
    """A router or service from Traefik's API (`kind` like `http/routers`), or None if absent."""
    async with session.get(f"{api_url}/api/{kind}/{name}@etcd") as resp:
        if resp.status == 404:
            return None
        resp.raise_for_status()
        data: dict[str, Any] = await resp.json()
        return data


async def router_enabled(session: Any, api_url: str, name: str, kind: str = "http/routers") -> bool:
    """True when Traefik lists the router enabled with no error."""
    router = await traefik_object(session, api_url, kind, name)
    assert router is not None, f"router {name} not in Traefik"
    assert router.get("status") == "enabled" and not router.get("error"), router
    return True
