"""Recovery: a daemon SIGKILLed mid-sync, and etcd stopped during a burst of changes."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import aiohttp
import pytest

from exporter.assembly import build_reconciler
from exporter.config import Settings
from exporter.embedded import (
    EmbeddedEtcd,
    EmbeddedTraefik,
    free_port,
    start_etcd,
    start_traefik,
)
from exporter.etcd.client import EtcdClient
from exporter.sources.files import IngressFiles
from tests.conftest import ROOT
from tests.helpers import (
    AUTHORITY,
    Backend,
    eventually,
    is_ready,
    run_cli,
    serves,
    start_daemon,
    stop_daemon,
    uid,
)
from tests.replay import replay

pytestmark = pytest.mark.integration


def ingress_file(ids: list[str], revision: int, url: str) -> str:
    lines = ["ingresses:"]
    for iid in ids:
        lines.append(
            f"  - {{authority: {AUTHORITY}, id: {iid}, revision: {revision}, hosts: [{iid}.test],"
            f' upstream: {{servers: [{{url: "{url}"}}]}}}}'
        )
    return "\n".join(lines) + "\n"


def daemon(config: Path, control: str, **env: str) -> subprocess.Popen[bytes]:
    return start_daemon(
        config, config.parent / "daemon.log",
        env={"EXPORTER_CONTROL__LISTEN": control, "EXPORTER_LOG__FORMAT": "human", "EXPORTER_API__ENABLED": "false", **env},
    )


async def _count(client: EtcdClient, prefix: str) -> int:
    return len((await client.range_prefix(prefix)).kvs)


async def test_sigkill_mid_sync_then_restart_converges_without_dangling_routers(
    tmp_path: Path, etcd: EmbeddedEtcd, etcd_client: EtcdClient, traefik: EmbeddedTraefik, http: aiohttp.ClientSession,
    backends: list[Backend],
) -> None:
    backends.append(await Backend("crash").start())
    space = uid("crash")
    ids = [f"{space}-{n}" for n in range(2000)]
    (tmp_path / "ingresses").mkdir()
    # A file (one request) holds at most 1,000 ingresses.
    (tmp_path / "ingresses" / "a.yaml").write_text(ingress_file(ids[:1000], 1, backends[0].url))
    (tmp_path / "ingresses" / "b.yaml").write_text(ingress_file(ids[1000:], 1, backends[0].url))
    config = tmp_path / "exporter.yaml"
    config.write_text(
        f'etcd: {{endpoints: ["{etcd.url}"]}}\nrecords_prefix: "{space}/records"\n'
        'sources: {files: ["ingresses/*.yaml"]}\n'
    )
    records = f"{space}/records/"
    start = await etcd_client.revision()
    # Small transactions, one at a time: the sync takes long enough to be killed in the middle.
    slow = {"EXPORTER_ETCD__MAX_TXN_OPS": "16", "EXPORTER_WRITER__MAX_IN_FLIGHT": "1"}
    first = daemon(config, f"127.0.0.1:{free_port()}", **slow)
    try:
        await eventually(lambda: _at_least(etcd_client, records, 100), timeout=60, interval=0.01)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        written = await _count(etcd_client, records)
        assert 100 <= written < 2000, f"killed after {written} records: not mid-sync"

        control = f"127.0.0.1:{free_port()}"
        second = daemon(config, control)
        try:
            await eventually(lambda: is_ready(http, f"http://{control}"), timeout=60)
            assert await _count(etcd_client, records) == 2000
            diff = await asyncio.to_thread(run_cli, "diff", "--config", str(config))
            assert diff.returncode == 0, diff.stdout[-2000:] + diff.stderr
            violations, checked = await replay(etcd.url, ROOT, start)
            # The first daemon alone wrote at least one revision per two of its records (16 operations a transaction).
            assert violations == [] and checked >= written // 2
            for iid in (ids[0], ids[999], ids[-1]):
                await eventually(lambda: serves(http, traefik.url("web"), f"{iid}.test"), timeout=30)
            # Clean up through the daemon itself: an empty file removes all 2,000.
            (tmp_path / "ingresses" / "a.yaml").write_text("ingresses: []\n")
            (tmp_path / "ingresses" / "b.yaml").unlink()
            routers = f"{ROOT}/http/routers/{AUTHORITY}_{space}"
            await eventually(lambda: _at_most(etcd_client, routers, 0), timeout=60)
        finally:
            stop_daemon(second)
            assert second.returncode == 0
    finally:
        if first.poll() is None:
            first.kill()
        await etcd_client.delete_prefix(f"{space}/")
    assert await _count(etcd_client, f"{ROOT}/http/routers/{AUTHORITY}_{space}") == 0


async def test_etcd_stopped_during_a_burst_every_change_lands(tmp_path: Path, http: aiohttp.ClientSession, backends: list[Backend]) -> None:
    etcd = start_etcd(tmp_path)
    traefik = start_traefik(tmp_path, etcd.url, ROOT, ["web"])
    old, new = await Backend("old").start(), await Backend("new").start()
    backends.extend([old, new])
    ids = [uid() for _ in range(20)]
    more = [uid() for _ in range(10)]
    path = tmp_path / "routes.yaml"
    path.write_text(ingress_file(ids, 1, old.url))
    settings = Settings.model_validate({"etcd": {"endpoints": [etcd.url], "timeout": 1.0}, "writer": {"coalesce_window": 0.01}})
    stop = asyncio.Event()
    async with EtcdClient([etcd.url], timeout=1.0) as client:
        rec = build_reconciler(settings, client)
        await rec.start()
        try:
            await rec.wait_synced(20)
            files = IngressFiles([str(path)], rec)
            await files.sync_all()
            follower = asyncio.create_task(files.follow(stop, retry_interval=0.2))
            await eventually(lambda: serves(http, traefik.url("web"), f"{ids[0]}.test", body="old"))

            etcd.stop()
            path.write_text(ingress_file(ids, 2, new.url) + ingress_file(more, 1, new.url).removeprefix("ingresses:\n"))
            await eventually(lambda: _unwritten(files, path))
            assert rec.status.etcd_ok is False
            await asyncio.to_thread(etcd.restart)

            for iid in (ids[0], ids[-1], more[0], more[-1]):
                await eventually(lambda: serves(http, traefik.url("web"), f"{iid}.test", body="new"), timeout=30)
            async with EtcdClient([etcd.url]) as check:
                kvs = (await check.range_prefix(f"{ROOT}/http/services/")).kvs
            urls = [kv.value for kv in kvs if kv.key.endswith("/url")]
            assert urls == [new.url] * 30
            assert files.errors == {}
            stop.set()
            await follower
        finally:
            stop.set()
            await rec.stop()
            traefik.stop()
            etcd.stop()


async def _at_least(client: EtcdClient, prefix: str, n: int) -> bool:
    return await _count(client, prefix) >= n


async def _at_most(client: EtcdClient, prefix: str, n: int) -> bool:
    return await _count(client, prefix) <= n


async def _unwritten(files: IngressFiles, path: Path) -> bool:
    return path.resolve() in files.errors
