"""Logs of a full daemon run: JSON lines, one per transaction with its ingresses and revision, no secrets."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from exporter.embedded import EmbeddedEtcd, free_port
from exporter.etcd.client import EtcdClient
from tests.helpers import eventually, is_ready, run_cli, start_daemon, stop_daemon, uid

pytestmark = pytest.mark.integration
TOKEN = "log-test-token-d41d8cd98f"
HEADER_SECRET = "Bearer sk-header-secret-0b1c"


async def test_json_logs_carry_transactions_and_no_secret(tmp_path: Path, etcd: EmbeddedEtcd, http: aiohttp.ClientSession) -> None:
    space = uid("logs")
    (tmp_path / "ingresses").mkdir()
    (tmp_path / "ingresses" / "a.yaml").write_text(
        "ingresses:\n"
        f"  - {{authority: logs, id: {space}, revision: 1, hosts: [{space}.test],\n"
        "     upstream: {kind: ai-proxy-multi, instances: [{name: a, url: 'http://127.0.0.1:9',\n"
        f"       checks: {{path: /v1/models, headers: {{Authorization: '{HEADER_SECRET}'}}, interval: 0.2}}}}]}}}}\n"
    )
    (tmp_path / "api-token").write_text(TOKEN)
    config = tmp_path / "exporter.yaml"
    api, control = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    config.write_text(
        f'etcd: {{endpoints: ["{etcd.url}"]}}\nrecords_prefix: "{space}/records"\nroot_key: "{space}/worker_{{authority}}"\n'
        f'sources: {{files: ["ingresses/*.yaml"]}}\napi: {{listen: "{api}", token_file: api-token}}\n'
        f'control: {{listen: "{control}"}}\nlog: {{format: json, level: DEBUG}}\n'
    )
    log = tmp_path / "daemon.log"
    proc = start_daemon(config, log)
    try:
        await eventually(lambda: is_ready(http, f"http://{control}"), timeout=30)
        async with http.get(f"http://{api}/v2/ingress", headers={"Authorization": "Bearer wrong"}) as resp:
            assert resp.status == 401
        diff = run_cli("diff", "--config", str(config))
    finally:
        stop_daemon(proc)
    text = log.read_text() + diff.stdout + diff.stderr
    for secret in (TOKEN, HEADER_SECRET, "PRIVATE KEY-----\\n"):
        assert secret not in text, secret
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    txns = [line for line in lines if line["message"].startswith("txn rev=")]
    assert txns and all({"revision", "ingresses", "level", "time"} <= set(t) for t in txns)
    assert any(f"logs/{space}" in t["ingresses"] for t in txns)
    async with EtcdClient([etcd.url]) as client:
        await client.delete_prefix(f"{space}/")
