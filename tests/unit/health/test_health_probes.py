"""Each health_check field reaches the probe and changes its outcome, against real sockets on loopback."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from exporter.embedded import free_port
from exporter.health.checkers import default_check, targets_of
from exporter.health.kinds import BUILTIN
from exporter.health.probes import http_probe, tcp_probe
from exporter.ingress import HealthCheck, Ingress
from exporter.plugin import Node


@pytest.fixture
async def server() -> AsyncIterator[str]:
    """A model server: `/health` 200, `/ready` 204, `/slow` after 2 s, `/keyed` 200 only with `X-Key: k`."""

    async def keyed(request: web.Request) -> web.Response:
        return web.Response(status=200 if request.headers.get("X-Key") == "k" else 401)

    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.Response()

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def ready(_: web.Request) -> web.Response:
        return web.Response(status=204)

    app = web.Application()
    app.router.add_get("/health", ok)
    app.router.add_get("/ready", ready)
    app.router.add_get("/slow", slow)
    app.router.add_get("/keyed", keyed)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


def _check(protocol: str = "http", **fields: Any) -> Any:
    return default_check(HealthCheck.model_validate({"enable": True, **fields}), protocol)


async def test_path_expected_status_and_max_wait_time_decide_an_http_probe(server: str) -> None:
    node = Node(server)
    assert await http_probe(node, _check()) == "success"
    assert await http_probe(node, _check(path="/ready")) == "http_failure"  # 204 is not the expected 200
    assert await http_probe(node, _check(path="/ready", expected_status_code=204)) == "success"
    assert await http_probe(node, _check(path="/slow", max_wait_time=0.2)) == "timeout_failure"


async def test_a_tcp_probe_connects_and_a_refused_connection_is_a_tcp_failure(server: str) -> None:
    assert await tcp_probe(Node(server.replace("http://", "tcp://")), _check("tcp")) == "success"
    assert await tcp_probe(Node(f"tcp://127.0.0.1:{free_port()}"), _check("tcp")) == "tcp_failure"


async def test_instance_checks_override_the_ingress_health_check_and_reach_the_probe(server: str) -> None:
    ingress = Ingress.model_validate({
        "authority": "a", "id": "x", "revision": 1, "hosts": ["x.test"],
        "health_check": {"enable": False, "interval": 10, "max_retries": 10, "max_wait_time": 15},
        "upstream": {"kind": "ai-proxy-multi", "instances": [
            {"name": "keyed", "url": server, "checks": {"path": "/keyed", "headers": {"X-Key": "k"}, "interval": 0.5,
                                                         "max_retries": 2, "max_wait_time": 0.2, "expected_status_code": 200}},
            {"name": "unchecked", "url": server},
        ]},
    })
    kinds = {k.kind: k for k in BUILTIN}
    [target] = targets_of(kinds, ingress)  # health_check.enable false: only the instance with its own checks
    check = target.check
    assert (check.path, check.interval, check.max_retries, check.timeout) == ("/keyed", 0.5, 2, 0.2)
    assert await http_probe(target.nodes[0], check) == "success"
    without_header = dataclasses.replace(check, headers=())
    assert await http_probe(target.nodes[0], without_header) == "http_failure"
    enabled = ingress.model_copy(update={"health_check": HealthCheck(enable=True, path="/ready", expected_status_code=204)})
    assert [t.check.path for t in targets_of(kinds, enabled)] == ["/keyed", "/ready"]
