"""Who may read the control server, its headers, `/v1/events`, and `traefik-etcd-exporter status` (real etcd and Traefik)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from exporter.control.status_client import EXIT_NOT_SERVED, EXIT_OK, EXIT_UNREACHABLE, status
from exporter.daemon import Daemon
from exporter.embedded import EmbeddedEtcd, EmbeddedTraefik, free_port
from tests.conftest import API_TOKEN, settings_for
from tests.helpers import AUTHORITY, Backend, eventually, uid

pytestmark = pytest.mark.integration
PAGES = ["/", "/ui/overview", "/ui/ingresses?q=x", "/ui/state.json", "/v1/events", "/v1/convergence", "/ui/static/status.js"]
OPEN = ["/healthz", "/readyz", "/metrics", "/v1/healthcheck"]


def _settings(etcd: EmbeddedEtcd, traefik: EmbeddedTraefik, listen: str) -> Any:
    return settings_for(
        etcd.url, records_prefix=f"{uid('acc')}/records",
        api={"listen": f"127.0.0.1:{free_port()}", "token": API_TOKEN}, control={"listen": listen},
        traefik={"api_url": traefik.api, "poll_interval": 0.2},
    )


@pytest.fixture(scope="module")
async def wide(etcd: EmbeddedEtcd, traefik: EmbeddedTraefik) -> AsyncIterator[Daemon]:
    """A daemon whose control server listens beyond loopback (reached here on 127.0.0.1)."""
    running = Daemon(_settings(etcd, traefik, f"0.0.0.0:{free_port()}"))
    await running.start()
    await running.parts.reconciler.wait_synced(30)
    yield running
    await running.stop()


def _base(daemon: Daemon) -> str:
    return f"http://127.0.0.1:{daemon.settings.control.listen.rpartition(':')[2]}"


async def _get(http: aiohttp.ClientSession, url: str, **headers: str) -> tuple[int, str, dict[str, str]]:
    async with http.get(url, headers=headers, allow_redirects=False) as resp:
        return resp.status, await resp.text(), dict(resp.headers)


async def test_beyond_loopback_every_page_and_json_needs_the_token_except_the_open_paths(wide: Daemon, http: aiohttp.ClientSession) -> None:
    base = _base(wide)
    for path in PAGES:
        code, body, headers = await _get(http, base + path)
        assert code == 401, path
        assert API_TOKEN not in body and headers["X-Content-Type-Options"] == "nosniff"
        assert (await _get(http, base + path, Authorization="Bearer wrong"))[0] == 401, path
        assert (await _get(http, base + path, Authorization=f"Bearer {API_TOKEN}"))[0] == 200, path
    for path in OPEN:
        assert (await _get(http, base + path))[0] == 200, path
    # A browser gets the login form; logging in sets a cookie (not the token) that opens the page.
    code, body, _ = await _get(http, base + "/", Accept="text/html")
    assert code == 401 and 'action="/ui/login"' in body
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as browser:
        async with browser.post(base + "/ui/login", data={"token": "wrong"}, allow_redirects=False) as resp:
            assert resp.status == 401
        async with browser.post(base + "/ui/login", data={"token": API_TOKEN}, allow_redirects=False) as resp:
            assert resp.status == 302
        assert all(API_TOKEN not in c.value for c in jar)
        async with browser.get(base + "/ui/state.json") as resp:
            assert resp.status == 200


async def test_pages_carry_a_policy_without_inline_scripts_and_gets_change_nothing(
    etcd: EmbeddedEtcd, traefik: EmbeddedTraefik, http: aiohttp.ClientSession
) -> None:
    running = Daemon(_settings(etcd, traefik, f"127.0.0.1:{free_port()}"))
    await running.start()
    try:
        await running.parts.reconciler.wait_synced(30)
        base = f"http://{running.settings.control.listen}"
        code, body, headers = await _get(http, base + "/")
        assert code == 200 and "script-src 'self'" in headers["Content-Security-Policy"]
        assert "unsafe-inline" not in headers["Content-Security-Policy"] and headers["X-Content-Type-Options"] == "nosniff"
        assert "<script>" not in body  # the one script is a file
        # Every route of the page is a GET: a POST changes nothing, it is refused.
        async with http.post(base + "/", data="x") as resp:
            assert resp.status == 405
        assert (await _get(http, base + "/ui/nothing"))[0] == 404
        assert (await _get(http, base + "/v1/events?limit=0"))[0] == 400
    finally:
        await running.stop()


async def test_events_and_status_report_a_refused_push_a_conflict_and_a_server_out_of_rotation(
    etcd: EmbeddedEtcd, traefik: EmbeddedTraefik, http: aiohttp.ClientSession, backends: list[Backend]
) -> None:
    running = Daemon(_settings(etcd, traefik, f"127.0.0.1:{free_port()}"))
    await running.start()
    api = f"http://{running.settings.api.listen}/v2/ingress"
    auth = {"Authorization": f"Bearer {API_TOKEN}"}
    backend = await Backend("status").start()
    backends.append(backend)
    iid = uid()
    body = {"authority": AUTHORITY, "id": iid, "revision": 2, "hosts": [f"{iid}.test"], "upstream": {"servers": [{"url": backend.url}]},
            "health_check": {"enable": True, "interval": 0.3, "max_retries": 1, "max_wait_time": 0.3, "initial_delay": 0}}
    try:
        await running.parts.reconciler.wait_synced(30)
        assert (await asyncio.to_thread(status, running.settings))[0] == EXIT_OK  # nothing stored: nothing unserved
        async with http.post(f"{api}/upsert?wait=served", json={"ingresses": [body]}, headers=auth) as resp:
            assert resp.status == 204
        async with http.post(f"{api}/upsert", json={"ingresses": [{**body, "revision": 1}]}, headers=auth) as resp:
            assert resp.status == 409
        async with http.post(f"{api}/upsert", json={"ingresses": [{**body, "hosts": ["bad host"]}]}, headers=auth) as resp:
            assert resp.status == 400
        events = f"http://{running.settings.control.listen}/v1/events?limit=1000"

        async def health_events() -> list[str]:
            async with http.get(events) as resp:
                return [e["text"] for e in (await resp.json())["events"] if e["kind"] == "health" and e["id"] == iid]

        # Its first probe puts the server in rotation (new servers get traffic only after one).
        assert any("back in rotation" in t for t in await eventually(health_events, timeout=10))
        await backend.stop()

        async def reported() -> str | None:
            code, text = await asyncio.to_thread(status, running.settings)
            return text if code == EXIT_NOT_SERVED and f"out of rotation: {backend.url}" in text else None

        text = await eventually(reported, timeout=10)
        assert f"ingress {AUTHORITY}/{iid} r2" in text and f"out of rotation: {backend.url}" in text
        async with http.get(events) as resp:
            kinds = {(e["kind"], e["id"]) for e in (await resp.json())["events"]}
        assert ("conflict", iid) in kinds and any(k == "refused" for k, _ in kinds)
        assert any("out of rotation" in t for t in await health_events())
    finally:
        async with http.post(f"{api}/remove", json={"ingresses": [{"authority": AUTHORITY, "id": iid, "revision": 2}]}, headers=auth):
            pass
        await running.stop()
    code, text = await asyncio.to_thread(status, running.settings)
    assert code == EXIT_UNREACHABLE and "does not answer" in text
