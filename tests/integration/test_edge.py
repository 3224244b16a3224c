"""The model-serving edge on a real Traefik: timeouts, keep-alive, allowlists and hostile paths, limits, retry."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from exporter.daemon import Daemon
from exporter.embedded import EmbeddedEtcd, EmbeddedTraefik, free_port
from exporter.errors import ValidationFailed
from exporter.etcd.client import EtcdClient
from tests.conftest import API_TOKEN, ROOT, Ingresses, settings_for
from tests.helpers import AUTHORITY, Backend, eventually, footprint, record, serve_all_paths, serves, tls_backend_context, uid

pytestmark = pytest.mark.integration


@dataclass
class Model:
    """A model server stand-in: records every request it receives (method, raw path, connection's client port)."""

    port: int = field(default_factory=free_port)
    seen: list[tuple[str, str, int]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def paths(self) -> list[str]:
        return [path for _method, path, _conn in self.seen]

    async def start(self) -> Model:
        async def handle(request: web.Request) -> web.StreamResponse:
            # The client port names the connection (an object id could be reused once a connection is gone).
            peer = request.transport.get_extra_info("peername") if request.transport else None
            self.seen.append((request.method, request.raw_path, peer[1] if peer else 0))
            if request.path == "/slow-headers":
                await asyncio.sleep(5)
            if request.path == "/hold":
                await self.release.wait()
            if request.path == "/sse":
                return await _stream(request)
            if request.path == "/fail":
                return web.Response(status=500, text="failed")
            await request.read()
            return web.Response(text="model")

        self._runner = await serve_all_paths(self.port, handle)
        return self

    async def stop(self) -> None:
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()


async def _stream(request: web.Request) -> web.StreamResponse:
    # Server-sent events: headers at once, then one event a second for five seconds.
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for n in range(5):
        await asyncio.sleep(1)
        await response.write(f"data: token {n}\n\n".encode())
    await response.write_eof()
    return response


@pytest.fixture
async def model() -> AsyncIterator[Model]:
    server = await Model().start()
    yield server
    await server.stop()


async def raw(traefik: EmbeddedTraefik, host: str, method: str, path: str, body: bytes = b"") -> int:
    """One HTTP/1.1 request sent byte for byte as written (no client normalises the path); its status."""
    reader, writer = await asyncio.open_connection("127.0.0.1", traefik.entrypoints["web"])
    try:
        head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        writer.write(head.encode() + body)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
        await reader.read()
        return int(status_line.split()[1])
    finally:
        writer.close()


async def _routed(traefik: EmbeddedTraefik, host: str, path: str = "/", method: str = "GET", status: int = 200) -> bool:
    return await raw(traefik, host, method, path) == status


# ----- the allowlist


# Each is answered 404 by Traefik, except the spellings Traefik cleans (`//`, `/./`): those reach
# the model only as the cleaned, allowed path (Traefik forwards the path it matched).
CLEANED = {"/v1//models": "/v1/models", "/v1/models/./x": "/v1/models/x"}
HOSTILE = [
    ("GET", "/metrics"),
    ("GET", "/docs"),
    ("GET", "/openapi.json"),
    ("POST", "/v1/load_lora_adapter"),
    ("POST", "/tokenize"),
    ("GET", "/v1/chat/completions"),  # allowed path, wrong method
    ("GET", "/v1/models/../metrics"),
    ("GET", "/v1/models/%2e%2e/metrics"),
    ("GET", "/v1/models/%2E%2E%2Fmetrics"),
    ("GET", "/v1/models/..%2Fmetrics"),
    ("GET", "/v1/models/x%2F..%2F..%2Fmetrics"),
    ("GET", "/v1/models/%2Fmetrics"),
    ("GET", "//metrics"),
    ("GET", "/v1//models"),
    ("GET", "/V1/MODELS/x"),
    ("GET", "/v1/models/METRICS"),
    ("GET", "/v1/models/metrics."),
    ("GET", "/v1/models/Docs.."),
    ("GET", "/v1/models/x/..;/..;/metrics"),
    ("GET", "/v1/models;x/../../metrics"),
    ("GET", "/v1/models/llama;jsessionid=1"),
    ("GET", "/v1/models/%252e%252e/metrics"),
    ("GET", "/v1/models/%00"),
    ("GET", "/v1/models/a\\..\\metrics"),
    ("GET", "/v1/models/./x"),
]


async def test_profile_openai_routes_only_its_allowlist_and_no_hostile_spelling(
    ingresses: Ingresses, traefik: EmbeddedTraefik, model: Model
) -> None:
    iid = uid()
    host = f"{iid}.test"
    await ingresses.upsert(record(iid, upstream={"servers": [{"url": model.url}]}, profile="openai"))
    await eventually(lambda: _routed(traefik, host, "/v1/models"))
    allowed = [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/v1/embeddings"),
               ("POST", "/v1/responses"), ("GET", "/v1/models"), ("HEAD", "/v1/models/llama"), ("GET", "/health")]
    for method, path in allowed:
        assert await raw(traefik, host, method, path) == 200, (method, path)
    for method, path in HOSTILE:
        model.seen.clear()
        status = await raw(traefik, host, method, path)
        if path in CLEANED:
            assert (status, model.paths()) == (200, [CLEANED[path]]), (method, path)
        else:
            # Answered by Traefik itself, and not one byte of it reached the model.
            assert (status, model.paths()) == (404, []), (method, path)


async def test_paths_and_blocked_segments_of_its_own(ingresses: Ingresses, traefik: EmbeddedTraefik, model: Model) -> None:
    iid = uid()
    host = f"{iid}.test"
    paths = [
        {"prefix": "/api/", "methods": ["GET", "POST"]}, {"exact": "/ping"},
        {"regex": "^/v2/models/[a-z0-9-]+/infer$", "methods": ["POST"]},
    ]
    await ingresses.upsert(record(iid, upstream={"servers": [{"url": model.url}]}, paths=paths, blocked_segments=["internal"],
                                  health_check={"path": "/healthz"}))
    await eventually(lambda: _routed(traefik, host, "/ping"))
    for method, path in [("GET", "/api/x"), ("POST", "/api/y/z"), ("DELETE", "/ping"), ("POST", "/v2/models/m1/infer"),
                         ("GET", "/healthz"), ("HEAD", "/healthz")]:
        assert await raw(traefik, host, method, path) == 200, (method, path)
    model.seen.clear()
    for method, path in [("DELETE", "/api/x"), ("GET", "/api"), ("GET", "/v2/models/m1/infer"), ("POST", "/v2/models/M1/infer"),
                         ("GET", "/api/Internal/x"), ("GET", "/api/x/internal"), ("POST", "/healthz"), ("GET", "/")]:
        assert await raw(traefik, host, method, path) == 404, (method, path)
    assert model.paths() == []


async def test_blocked_segments_alone_keep_path_prefix_routing(ingresses: Ingresses, traefik: EmbeddedTraefik, model: Model) -> None:
    iid = uid()
    host = f"{iid}.test"
    await ingresses.upsert(record(iid, upstream={"servers": [{"url": model.url}]}, path_prefix="/v1", blocked_segments=["metrics"]))
    await eventually(lambda: _routed(traefik, host, "/v1/anything"))
    model.seen.clear()
    for path in ("/v1/metrics", "/v1/x/METRICS.", "/v1/%6detrics", "/v1/../metrics", "/other"):
        assert await raw(traefik, host, "GET", path) == 404, path
    assert model.paths() == []


# ----- timeouts and keep-alive


async def test_response_header_timeout_504s_a_hung_server_while_a_stream_flows_past_it(
    ingresses: Ingresses, traefik: EmbeddedTraefik, model: Model, http: aiohttp.ClientSession
) -> None:
    iid = uid()
    host = f"{iid}.test"
    await ingresses.upsert(record(iid, upstream={"servers": [{"url": model.url}]}, timeouts={"response_header": 1, "dial": 2}))
    await eventually(lambda: _routed(traefik, host, "/ready"))
    web_url = traefik.url("web")
    started = time.monotonic()
    async with http.get(f"{web_url}/slow-headers", headers={"Host": host}) as resp:
        assert resp.status == 504
    assert 0.9 <= time.monotonic() - started <= 2.5
    started = time.monotonic()
    async with http.get(f"{web_url}/sse", headers={"Host": host}, timeout=aiohttp.ClientTimeout(total=20)) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        body = (await resp.read()).decode()
    assert body == "".join(f"data: token {n}\n\n" for n in range(5))
    assert time.monotonic() - started >= 4.5


async def test_keepalive_false_opens_one_upstream_connection_per_request(
    ingresses: Ingresses, traefik: EmbeddedTraefik, model: Model, http: aiohttp.ClientSession
) -> None:
    kept, fresh = uid(), uid()
    await ingresses.upsert(record(kept, upstream={"servers": [{"url": model.url}]}),
                           record(fresh, upstream={"servers": [{"url": model.url}]}, keepalive=False))
    web_url = traefik.url("web")
    for iid in (kept, fresh):
        await eventually(lambda: _routed(traefik, f"{iid}.test"))
    connections = {}
    for iid in (kept, fresh):
        model.seen.clear()
        for _ in range(8):
            async with http.get(f"{web_url}/x", headers={"Host": f"{iid}.test"}) as resp:
                assert resp.status == 200
                await resp.read()
        connections[iid] = len({conn for _m, _p, conn in model.seen})
    assert connections[fresh] == 8 and connections[kept] <= 2, connections


# ----- limits and retry


async def test_limits_answer_413_and_429_at_the_configured_points(
    ingresses: Ingresses, traefik: EmbeddedTraefik, model: Model, http: aiohttp.ClientSession
) -> None:
    body_id, flight_id, rate_id = uid(), uid(), uid()
    up = {"servers": [{"url": model.url}]}
    await ingresses.upsert(
        record(body_id, upstream=up, limits={"max_body_bytes": 1000}),
        record(flight_id, upstream=up, limits={"max_in_flight": 1}),
        record(rate_id, upstream=up, limits={"rate": {"average": 1, "burst": 1, "period": 60}}),
    )
    for iid in (body_id, flight_id):
        await eventually(lambda: _routed(traefik, f"{iid}.test"))
    assert await raw(traefik, f"{body_id}.test", "POST", "/x", b"a" * 1000) == 200
    assert await raw(traefik, f"{body_id}.test", "POST", "/x", b"a" * 1001) == 413
    held = asyncio.create_task(raw(traefik, f"{flight_id}.test", "GET", "/hold"))
    await eventually(lambda: _holding(model))
    assert await raw(traefik, f"{flight_id}.test", "GET", "/x") == 429
    model.release.set()
    assert await held == 200
    assert await raw(traefik, f"{flight_id}.test", "GET", "/x") == 200
    await eventually(lambda: _routed_or_limited(traefik, f"{rate_id}.test"))
    assert [await raw(traefik, f"{rate_id}.test", "GET", "/x") for _ in range(3)] == [429, 429, 429]


async def _holding(model: Model) -> bool:
    return "/hold" in model.paths()


async def _routed_or_limited(traefik: EmbeddedTraefik, host: str) -> bool:
    # The rate limiter's one token may go to the poll that first finds the router.
    return await raw(traefik, host, "GET", "/x") in (200, 429) and await raw(traefik, host, "GET", "/x") == 429


async def test_retry_retries_only_requests_that_never_reached_a_server(
    ingresses: Ingresses, traefik: EmbeddedTraefik, model: Model
) -> None:
    retried, plain = uid(), uid()
    dead = f"http://127.0.0.1:{free_port()}"
    up = {"servers": [{"url": dead}, {"url": model.url}]}
    await ingresses.upsert(record(retried, upstream=up, retry={"attempts": 2, "initial_interval": 0.01}), record(plain, upstream=up))
    for iid in (retried, plain):
        await eventually(lambda: _routed(traefik, f"{iid}.test", status=200))
    # A refused connection is retried on the next server: every request answers 200.
    assert {await raw(traefik, f"{retried}.test", "GET", "/x") for _ in range(10)} == {200}
    assert 502 in {await raw(traefik, f"{plain}.test", "GET", "/x") for _ in range(10)}
    # A server that answered (500) is not asked again: one request, one attempt.
    model.seen.clear()
    statuses = [await raw(traefik, f"{retried}.test", "GET", "/fail") for _ in range(6)]
    assert set(statuses) == {500} and model.paths().count("/fail") == 6


# ----- refused before anything is written


BAD = [
    ({"timeouts": {"response_header": -1}}, "timeouts.response_header"),
    ({"timeouts": {"dial": 0}}, "timeouts.dial"),
    ({"profile": "tgi"}, "profile"),
    ({"paths": [{"regex": "^/a("}]}, "paths.0.regex"),
    ({"paths": [{"regex": "^/a`) || Host(`evil.test"}]}, "paths.0.regex"),
    ({"paths": [{"regex": "^/a(?=b)"}]}, "paths.0.regex"),
    ({"paths": [{"prefix": "/a", "methods": ["BREW"]}]}, "paths.0.methods.0"),
    ({"paths": [{"prefix": "/a`b"}]}, "paths.0.prefix"),
    ({"paths": [{"exact": "/a\nb"}]}, "paths.0.exact"),
    ({"paths": [{"prefix": "/a", "exact": "/b"}]}, "paths.0"),
    ({"blocked_segments": ["a/b"]}, "blocked_segments.0"),
    ({"limits": {"max_in_flight": 0}}, "limits.max_in_flight"),
    ({"retry": {"attempts": 0}}, "retry.attempts"),
    ({"canary": {"weight": 10, "upstream": {"servers": [{"url": "http://127.0.0.1:9"}]}, "min_ready": 0}}, "canary.min_ready"),
]


@pytest.mark.parametrize(("fields", "loc"), BAD, ids=[loc for _f, loc in BAD])
def test_hostile_values_are_refused_naming_the_field(fields: dict[str, Any], loc: str) -> None:
    from pydantic import ValidationError

    from exporter.ingress import UpsertRequest, field_errors

    body = {"ingresses": [{"authority": "test", "id": "edge", "revision": 1, "hosts": ["edge.test"],
                           "upstream": {"servers": [{"url": "http://127.0.0.1:9"}]}, **fields}]}
    with pytest.raises(ValidationError) as info:
        UpsertRequest.model_validate(body)
    locs = [e["loc"] for e in field_errors(info.value)]
    assert any(x == f"ingresses.0.{loc}" or x.startswith(f"ingresses.0.{loc}.") for x in locs), locs


async def test_a_timeout_outside_the_configured_bounds_is_refused_and_nothing_written(ingresses: Ingresses) -> None:
    from exporter.render.edge import EdgePolicy

    ingress = record(uid(), upstream={"servers": [{"url": "http://127.0.0.1:9"}]}, timeouts={"response_header": 7200}).ingress
    with pytest.raises(ValidationFailed) as info:
        EdgePolicy().admit(ingress)
    [error] = info.value.data["errors"]
    assert error["loc"].endswith(".timeouts.response_header") and error["msg"] == "7200 is outside upstream.timeouts_bounds [0.1, 3600.0]"


# ----- a daemon of its own: CA files, bounds through the push API


@dataclass
class EdgeDaemon:
    daemon: Daemon
    ca_dir: Path

    @property
    def api(self) -> str:
        return f"http://{self.daemon.settings.api.listen}"

    @property
    def control(self) -> str:
        return f"http://{self.daemon.settings.control.listen}"


@pytest.fixture(scope="module")
async def edge_daemon(etcd: EmbeddedEtcd, traefik: EmbeddedTraefik, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EdgeDaemon]:
    ca_dir = tmp_path_factory.mktemp("secrets")
    settings = settings_for(
        etcd.url, records_prefix=f"{uid('edge')}/records",
        api={"listen": f"127.0.0.1:{free_port()}", "token": API_TOKEN}, control={"listen": f"127.0.0.1:{free_port()}"},
        upstream={"ca_file_dirs": [str(ca_dir)]},
    )
    daemon = Daemon(settings)
    await daemon.start()
    await daemon.parts.reconciler.wait_synced(30)
    yield EdgeDaemon(daemon, ca_dir)
    await daemon.stop()


async def _written(edge: EdgeDaemon, etcd_client: EtcdClient, *ids: str) -> dict[str, int]:
    """What the edge daemon could have written (tests/helpers.py `footprint`)."""
    return await footprint(etcd_client, edge.daemon.settings.records_prefix, ROOT, *ids)


async def push(http: aiohttp.ClientSession, edge: EdgeDaemon, path: str, *ingresses: dict[str, Any]) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    async with http.post(f"{edge.api}/v2/ingress/{path}", json={"ingresses": list(ingresses)}, headers=headers) as resp:
        text = await resp.text()
        return resp.status, json.loads(text) if text else None


def _body(iid: str, **fields: Any) -> dict[str, Any]:
    return {"authority": AUTHORITY, "id": iid, "revision": 1, "hosts": [f"{iid}.test"], **fields}


def _replace(path: Path, text: str) -> None:
    # How a projected secret changes: the new content appears at once, never half-written.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


async def _reason(http: aiohttp.ClientSession, edge: EdgeDaemon, text: str | None) -> bool:
    async with http.get(f"{edge.control}/readyz") as resp:
        reasons: list[str] = (await resp.json())["reasons"]
    return any(text in r for r in reasons) if text is not None else not any("CA file" in r for r in reasons)


async def test_a_rotated_ca_file_is_trusted_within_2s_without_a_traefik_restart(
    edge_daemon: EdgeDaemon, traefik: EmbeddedTraefik, http: aiohttp.ClientSession, etcd_client: EtcdClient, tmp_path: Path,
    backends: list[Backend],
) -> None:
    ca_file = edge_daemon.ca_dir / "ca.crt"
    for run in ("first", "second"):
        (tmp_path / run).mkdir()
    first_ca, first = tls_backend_context(tmp_path / "first", "model.internal")
    ca_file.write_text(first_ca)
    backend = await Backend("rotated", ssl_context=first).start()
    backends.append(backend)
    iid = uid()
    tls = {"ca_file": str(ca_file), "server_name": "model.internal"}
    assert (await push(http, edge_daemon, "upsert", _body(iid, upstream={"servers": [{"url": backend.url}]}, upstream_tls=tls)))[0] == 204
    web_url = traefik.url("web")
    await eventually(lambda: serves(http, web_url, f"{iid}.test", body="rotated"))
    traefik_pid = traefik.proc.pid

    # The backend is re-issued from a new CA: Traefik no longer trusts it, until the file rotates.
    second_ca, second = tls_backend_context(tmp_path / "second", "model.internal")
    await backend.stop()
    backend.ssl_context = second
    await backend.start()
    assert await serves(http, web_url, f"{iid}.test", status=500)
    rotated = time.monotonic()
    _replace(ca_file, second_ca)
    await eventually(lambda: serves(http, web_url, f"{iid}.test", body="rotated"), interval=0.02)
    took = time.monotonic() - rotated
    assert took <= 2.0 + 0.1 + 0.5, f"served over the new CA after {took:.2f}s"
    assert [await serves(http, web_url, f"{iid}.test", body="rotated") for _ in range(20)] == [True] * 20
    assert traefik.proc.pid == traefik_pid and traefik.proc.poll() is None

    # An invalid file changes nothing in etcd: the last good CA stays, /readyz says why.
    before = await _written(edge_daemon, etcd_client, iid)
    _replace(ca_file, "not a certificate\n")
    await eventually(lambda: _reason(http, edge_daemon, f"upstream CA file {ca_file} holds no valid PEM certificate"))
    ca_file.unlink()
    await eventually(lambda: _reason(http, edge_daemon, f"upstream CA file {ca_file} does not exist"))
    assert await _written(edge_daemon, etcd_client, iid) == before
    assert await serves(http, web_url, f"{iid}.test", body="rotated")
    _replace(ca_file, second_ca)
    await eventually(lambda: _reason(http, edge_daemon, None))
    assert await _written(edge_daemon, etcd_client, iid) == before  # the same content: nothing to rewrite
    assert (await push(http, edge_daemon, "remove", {"authority": AUTHORITY, "id": iid, "revision": 1}))[0] == 204


async def test_bounds_and_ca_files_are_checked_before_anything_is_written(
    edge_daemon: EdgeDaemon, http: aiohttp.ClientSession, etcd_client: EtcdClient
) -> None:
    up = {"servers": [{"url": "https://127.0.0.1:9"}]}
    before = await _written(edge_daemon, etcd_client)
    cases = [
        (_body(uid(), upstream=up, timeouts={"response_header": 7200}), ".timeouts.response_header",
         "7200 is outside upstream.timeouts_bounds [0.1, 3600.0]"),
        (_body(uid(), upstream=up, timeouts={"idle": 0.01}), ".timeouts.idle", "0.01 is outside upstream.timeouts_bounds [0.1, 3600.0]"),
        (_body(uid(), upstream=up, upstream_tls={"ca_file": "/etc/ssl/private/x.pem"}), ".upstream_tls.ca_file",
         f"is not in upstream.ca_file_dirs ({edge_daemon.ca_dir})"),
        (_body(uid(), upstream=up, upstream_tls={"ca_file": str(edge_daemon.ca_dir / "missing.crt")}), ".upstream_tls.ca_file",
         "does not exist"),
    ]
    for body, loc, msg in cases:
        status, answer = await push(http, edge_daemon, "upsert", body)
        assert status == 400 and answer["type"] == "ValidationFailed", answer
        [error] = answer["data"]["errors"]
        assert error["loc"].endswith(loc) and error["msg"] == msg, error
    assert await _written(edge_daemon, etcd_client) == before
