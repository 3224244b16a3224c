"""Each health_check field reaches the probe and changes its outcome, against real sockets on loopback."""

from __future__ import annotations

import asyncio
import dataclasses
import os
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


@pytest.fixture
async def raw_server() -> AsyncIterator[tuple[str, list[bytes]]]:
    """A server that answers by path with bytes written as given: what HTTP servers do at the edges of the protocol.

    `/bare` answers a status line without a reason phrase, `/split` sends its status line in two writes, `/hangup`
    closes without a word, `/silent` never answers. The list gets each request as received.
    """
    requests: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        requests.append(request)
        path = request.split(b" ", 2)[1]
        if path == b"/bare":
            writer.write(b"HTTP/1.1 200\r\n\r\n")
        elif path == b"/split":
            writer.write(b"HTTP/1.1 2")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"04 No Content\r\n\r\n")
        elif path == b"/silent":
            await reader.read()  # until the prober gives up and closes
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", requests
    server.close()


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_status_lines_at_the_protocol_s_edges_decide_a_probe_on_both_paths(raw_server: tuple[str, list[bytes]]) -> None:
    url, _ = raw_server
    # The IP literal takes the socket path; the host name, asyncio's streams: both read the same outcome.
    for node in (Node(url), Node(url.replace("127.0.0.1", "localhost"))):
        assert await http_probe(node, _check(path="/bare")) == "success", node
        assert await http_probe(node, _check(path="/split", expected_status_code=204)) == "success", node
        assert await http_probe(node, _check(path="/hangup")) == "http_failure", node
        assert await http_probe(node, _check(path="/silent", max_wait_time=0.1)) == "timeout_failure", node
    refused = Node(f"http://127.0.0.1:{free_port()}")
    assert await http_probe(refused, _check()) == "tcp_failure"


async def test_the_socket_path_sends_the_request_the_check_describes(raw_server: tuple[str, list[bytes]]) -> None:
    url, requests = raw_server
    node = Node(url)
    check = dataclasses.replace(_check(path="/bare"), headers=(("X-Key", "k"),))
    assert await http_probe(node, check, agent="probe-agent (s1)") == "success"
    assert requests[-1] == (f"GET /bare HTTP/1.1\r\nHost: 127.0.0.1:{node.port}\r\nUser-Agent: probe-agent (s1)\r\n"
                            "Connection: close\r\nX-Key: k\r\n\r\n").encode()


async def test_a_cancelled_or_timed_out_probe_leaves_no_socket_open(raw_server: tuple[str, list[bytes]]) -> None:
    url, _ = raw_server
    node, before = Node(url), _open_descriptors()
    probes = [asyncio.ensure_future(http_probe(node, _check(path="/silent"))) for _ in range(50)]
    timed_out = [http_probe(node, _check(path="/silent", max_wait_time=0.05)) for _ in range(50)]
    assert set(await asyncio.gather(*timed_out)) == {"timeout_failure"}
    for probe in probes:
        probe.cancel()
    await asyncio.gather(*probes, return_exceptions=True)
    # The server's ends close once it reads the probes' ends closing.
    deadline = asyncio.get_running_loop().time() + 5
    while _open_descriptors() > before and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)
    assert _open_descriptors() == before


async def test_an_ipv6_literal_is_probed_on_the_socket_path() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\n\r\n")
        writer.close()

    try:
        server = await asyncio.start_server(answer, "::1", 0)
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    port = server.sockets[0].getsockname()[1]
    try:
        assert await http_probe(Node(f"http://[::1]:{port}"), _check(expected_status_code=503)) == "success"
        assert await http_probe(Node(f"http://[::1]:{port}"), _check()) == "http_failure"
        assert await tcp_probe(Node(f"tcp://[::1]:{port}"), _check("tcp")) == "success"
    finally:
        server.close()
