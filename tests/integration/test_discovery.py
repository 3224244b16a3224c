"""Service discovery on a real redis-server: the hash Backend.AI's coordinator reads, heartbeat, outage, SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from exporter import __version__
from exporter.daemon import Daemon
from exporter.embedded import EmbeddedEtcd, free_port
from tests.conftest import API_TOKEN, settings_for
from tests.helpers import eventually, is_ready, start_daemon, stop_daemon, uid
from tests.redis_server import RedisServer, start_redis

pytestmark = pytest.mark.integration
GROUP = "appproxy-worker"


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = start_redis(tmp_path)
    yield server
    server.stop()


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    conn = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    yield conn
    await conn.aclose()


def _discovery(redis_url: str, api: str) -> dict[str, Any]:
    return {"redis_url": redis_url, "authorities": ["Worker_1"], "advertise": api, "ttl": 3, "heartbeat": 0.3}


async def _registration(client: aioredis.Redis) -> dict[str, Any] | None:
    try:
        keys = await client.keys(f"service_discovery.{GROUP}.*")
        if len(keys) != 1:
            return None
        fields = await client.hgetall(keys[0])
        ttl = await client.ttl(keys[0])
    except RedisError:
        return None  # our own connection did not survive a Redis restart; the next call reconnects
    return {"key": keys[0], "ttl": ttl, **{str(k): json.loads(v) for k, v in fields.items()}}


async def test_registration_heartbeat_outage_and_unregister(
    etcd: EmbeddedEtcd, redis_server: RedisServer, client: aioredis.Redis, http: aiohttp.ClientSession
) -> None:
    api, control = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    settings = settings_for(etcd.url, records_prefix=f"{uid('sd')}/records", api={"listen": api, "token": API_TOKEN},
                            control={"listen": control}, discovery=_discovery(redis_server.url, api))
    daemon = Daemon(settings)
    await daemon.start()
    try:
        first = await eventually(lambda: _registration(client))
        control_port = control.rpartition(":")[2]
        expected_id = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{GROUP}/127.0.0.1:{control_port}"))
        assert first["key"] == f"service_discovery.{GROUP}.{expected_id}" and first["id"] == expected_id
        assert first["display_name"] == "appproxy-worker-Worker_1" and first["service_group"] == GROUP
        assert first["version"] == __version__
        assert first["endpoint"] == {"address": "127.0.0.1", "port": int(api.rpartition(":")[2]), "protocol": "http",
                                     "prometheus_address": f"127.0.0.1:{control_port}"}
        assert first["labels"] == {"ingress-delivery-mode": "api", "authority": "Worker_1"}
        assert 0 < first["ttl"] <= 3
        # The heartbeat rewrites the hash and its expiry.
        later = await eventually(lambda: _heartbeat_after(client, first["health_status"]["last_heartbeat"]))
        assert later["health_status"]["registration_time"] == first["health_status"]["registration_time"]
        await eventually(lambda: is_ready(http, f"http://{control}"), timeout=30)

        # Redis down: readiness says so, the push API keeps answering.
        redis_server.stop()
        await eventually(lambda: _not_ready_because(http, control, "discovery: redis unreachable"), timeout=10)
        body = {"ingresses": [{"authority": "test", "id": uid(), "revision": 1, "hosts": ["sd.test"],
                               "upstream": {"servers": [{"url": "http://127.0.0.1:9"}]}}]}
        async with http.post(f"http://{api}/v2/ingress/upsert", json=body, headers={"X-BackendAI-Token": API_TOKEN}) as resp:
            assert resp.status == 204
        # Redis back, empty: registered again at the next heartbeat.
        await asyncio.to_thread(redis_server.start)
        await eventually(lambda: _registration(client), timeout=10)
        await eventually(lambda: is_ready(http, f"http://{control}"), timeout=10)
        body["ingresses"][0]["revision"] = 2
        async with http.post(f"http://{api}/v2/ingress/remove", json={"ingresses": [{"authority": "test",
                                                                                     "id": body["ingresses"][0]["id"]}]},
                             headers={"X-BackendAI-Token": API_TOKEN}) as resp:
            assert resp.status == 204
    finally:
        await daemon.stop()
    assert await client.keys(f"service_discovery.{GROUP}.*") == []


async def _heartbeat_after(client: aioredis.Redis, at: float) -> dict[str, Any] | None:
    current = await _registration(client)
    return current if current and current["health_status"]["last_heartbeat"] > at else None


async def _not_ready_because(http: aiohttp.ClientSession, control: str, reason: str) -> bool:
    async with http.get(f"http://{control}/readyz") as resp:
        return resp.status == 503 and any(r.startswith(reason) for r in (await resp.json())["reasons"])


async def test_sigterm_removes_the_registration(
    tmp_path: Path, etcd: EmbeddedEtcd, redis_server: RedisServer, client: aioredis.Redis
) -> None:
    api = f"127.0.0.1:{free_port()}"
    config = tmp_path / "exporter.yaml"
    config.write_text(json.dumps({
        "etcd": {"endpoints": [etcd.url]}, "records_prefix": f"{uid('sd')}/records",
        "api": {"listen": api}, "control": {"listen": f"127.0.0.1:{free_port()}"},
        "discovery": _discovery(redis_server.url, api),
    }))
    proc = start_daemon(config, tmp_path / "daemon.log", env={"EXPORTER_API__TOKEN": API_TOKEN})
    try:
        await eventually(lambda: _registration(client), timeout=30)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 20) == 0
    finally:
        stop_daemon(proc)
    assert await client.keys(f"service_discovery.{GROUP}.*") == []
