"""The alert rules against a real Prometheus scraping a real daemon (Debian's `prometheus` package).

A daemon with its own etcd (so the test may stop it), the push API on, a health-checked backend;
Prometheus scrapes its control server every second and evaluates deploy/prometheus/alerts.yml
every second. The scenario: pushes with a wrong token, the backend going down, etcd stopped.
Each should turn its alert pending (their `for:` is minutes long: pending is what one evaluation
shows), and no other alert may.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from exporter.daemon import Daemon
from exporter.embedded import EmbeddedEtcd, free_port, start_etcd
from tests.conftest import settings_for
from tests.helpers import AUTHORITY, Backend, eventually, uid

pytestmark = pytest.mark.integration

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"
TOKEN = "prometheus-test-token"
# Alerts the scenario must raise, and those whose series it never makes true.
EXPECTED = {"ExporterPushesUnauthorized", "UpstreamsEjected", "ExporterNotReady"}


def _prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        assert not os.environ.get("CI"), "prometheus is missing: install Debian's prometheus package"
        pytest.skip("prometheus is not installed here (Debian's prometheus package)")
    return found


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[EmbeddedEtcd]:
    (tmp_path / "etcd").mkdir()
    etcd = start_etcd(tmp_path / "etcd")
    yield etcd
    etcd.stop()


@pytest.fixture
async def daemon(own_etcd: EmbeddedEtcd) -> AsyncIterator[Daemon]:
    settings = settings_for(
        own_etcd.url, etcd={"endpoints": [own_etcd.url], "timeout": 1.0},
        api={"listen": f"127.0.0.1:{free_port()}", "token": TOKEN}, control={"listen": f"127.0.0.1:{free_port()}"},
    )
    started = Daemon(settings)
    await started.start()
    await started.parts.reconciler.wait_synced(30)
    yield started
    await started.stop()


@pytest.fixture
def prometheus(tmp_path: Path, daemon: Daemon) -> Iterator[str]:
    binary = _prometheus_binary()
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "traefik-etcd-exporter",
                            "static_configs": [{"targets": [daemon.settings.control.listen]}]}],
    }))
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


async def _alerts(http: aiohttp.ClientSession, prometheus: str) -> dict[str, str]:
    """Every active alert by name, with its state (pending or firing)."""
    async with http.get(f"{prometheus}/api/v1/alerts") as resp:
        data: dict[str, Any] = await resp.json()
    return {a["labels"]["alertname"]: a["state"] for a in data["data"]["alerts"]}


async def _scraped(http: aiohttp.ClientSession, prometheus: str) -> bool:
    try:
        async with http.get(f"{prometheus}/api/v1/query", params={"query": 'up{job="traefik-etcd-exporter"}'}) as resp:
            result = (await resp.json())["data"]["result"]
    except aiohttp.ClientError:
        return False
    return bool(result) and result[0]["value"][1] == "1"


async def test_the_scenario_raises_its_alerts_and_no_other(
    daemon: Daemon, prometheus: str, own_etcd: EmbeddedEtcd, http: aiohttp.ClientSession, backends: list[Backend]
) -> None:
    await eventually(lambda: _scraped(http, prometheus), timeout=30)
    backend = await Backend("watched").start()
    backends.append(backend)
    api = f"http://{daemon.settings.api.listen}/v2/ingress/upsert"
    iid = uid()
    body = {"ingresses": [{"authority": AUTHORITY, "id": iid, "revision": 1, "hosts": [f"{iid}.test"],
                           "upstream": {"servers": [{"url": backend.url}]},
                           "health_check": {"enable": True, "interval": 0.2, "max_retries": 2, "max_wait_time": 0.5,
                                            "initial_delay": 0}}]}
    async with http.post(api, json=body, headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
        assert resp.status == 204
    # A coordinator with the wrong token, for a few seconds of scrapes.
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        async with http.post(api, json=body, headers={"Authorization": "Bearer wrong"}) as resp:
            assert resp.status == 401
    await backend.stop()

    async def raised(names: set[str]) -> bool:
        return names <= set(await _alerts(http, prometheus))
    await eventually(lambda: raised({"ExporterPushesUnauthorized", "UpstreamsEjected"}), timeout=60, interval=0.5)
    own_etcd.stop()
    await eventually(lambda: raised(EXPECTED), timeout=60, interval=0.5)
    active = await _alerts(http, prometheus)
    # While etcd is down the daemon's failing etcd requests count too: that alert belongs to the scenario.
    assert set(active) - EXPECTED <= {"ExporterEtcdErrors"}, active
