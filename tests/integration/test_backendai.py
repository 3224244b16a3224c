"""What Backend.AI sends is accepted and served: free-text authority, ratio weights, its health-check range,
remove without revision, large ingress files (real etcd and Traefik)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from exporter.daemon import Daemon
from exporter.embedded import EmbeddedEtcd, EmbeddedTraefik, start_traefik
from exporter.errors import ExporterError
from exporter.health.checkers import default_check
from exporter.ingress import HealthCheck
from exporter.sources.files import load_ingress_file
from tests.conftest import API_TOKEN
from tests.helpers import Backend, eventually, get_via, serves

AUTHORITY = "Worker_1"


@pytest.fixture(scope="module")
def worker_traefik(tmp_path_factory: pytest.TempPathFactory, etcd: EmbeddedEtcd) -> Iterator[EmbeddedTraefik]:
    """The Traefik of a Backend.AI worker whose authority is not a DNS label: rootKey traefik/worker_Worker_1."""
    server = start_traefik(tmp_path_factory.mktemp("worker"), etcd.url, f"traefik/worker_{AUTHORITY}", ["web"])
    yield server
    server.stop()


async def _push(http: aiohttp.ClientSession, daemon: Daemon, path: str, body: dict[str, Any]) -> None:
    async with http.post(f"http://{daemon.settings.api.listen}/v2/ingress/{path}", json=body,
                         headers={"X-BackendAI-Token": API_TOKEN, "X-BackendAI-RequestID": str(uuid.uuid4())}) as resp:
        assert resp.status == 204, await resp.text()


@pytest.mark.integration
async def test_a_backendai_circuit_is_served_with_its_ratios_and_removed_without_revision(
    api_daemon: Daemon, worker_traefik: EmbeddedTraefik, http: aiohttp.ClientSession, backends: list[Backend]
) -> None:
    main, minor = await Backend("main").start(), await Backend("minor").start()
    backends.extend([main, minor])
    circuit = str(uuid.uuid4())
    host = f"{circuit}.apps.test"
    ingress = {
        "authority": AUTHORITY, "id": circuit, "revision": 1, "hosts": [host],
        "upstream": {"servers": [{"url": main.url, "weight": 0.7}, {"url": minor.url, "weight": 0.3}]},
        "health_check": {"enable": True, "interval": 7200, "max-retries": 0, "max-wait-time": 5, "initial-delay": 0},
    }
    await _push(http, api_daemon, "upsert", {"ingresses": [ingress]})
    web = worker_traefik.url("web")
    await eventually(lambda: _both_serve(http, web, host), timeout=20)
    seen: Counter[str] = Counter()
    for _ in range(200):
        status, text = await get_via(http, web, host)
        seen[text if status == 200 else str(status)] += 1
    assert set(seen) == {"main", "minor"} and 100 < seen["main"] < 180, seen
    await _push(http, api_daemon, "remove", {"ingresses": [{"authority": AUTHORITY, "id": circuit}]})
    await eventually(lambda: serves(http, web, host, status=404))


async def _both_serve(http: aiohttp.ClientSession, web: str, host: str) -> bool:
    answers = {(await get_via(http, web, host))[1] for _ in range(20)}
    return answers == {"main", "minor"}


def test_backendai_health_check_edge_values_have_their_documented_meaning() -> None:
    check = default_check(HealthCheck.model_validate({"interval": 0, "max-retries": 0, "max-wait-time": -1}), "http")
    assert (check.interval, check.max_retries, check.timeout) == (0.1, 1, 0.1)
    long = default_check(HealthCheck.model_validate({"interval": 7200, "expected_status_code": 299}), "http")
    assert (long.interval, long.expected_status) == (7200, 299)


def test_an_ingress_file_is_bounded_by_size_not_by_a_count(tmp_path: Path) -> None:
    path = tmp_path / "many.yaml"
    path.write_text("ingresses:\n" + "".join(
        f"  - {{authority: {AUTHORITY}, id: c{n}, revision: 1, hosts: [c{n}.test], "
        f'upstream: {{servers: [{{url: "http://10.0.0.1:80"}}]}}}}\n'
        for n in range(1500)
    ))
    assert len(load_ingress_file(path)) == 1500
    with pytest.raises(ExporterError) as info:
        load_ingress_file(path, max_bytes=4096)
    assert "sources.max_file_bytes" in info.value.title
