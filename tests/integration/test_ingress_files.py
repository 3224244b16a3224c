"""Ingress files as a source: applied, hot-reloaded, and a bad file keeps its last good content."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from exporter.embedded import EmbeddedEtcd
from exporter.etcd.client import EtcdClient
from exporter.keys import IngressRef
from exporter.reconcile import Reconciler
from exporter.sources.files import IngressFiles
from tests.conftest import ROOT
from tests.helpers import AUTHORITY, eventually, ingress_yaml, uid

pytestmark = pytest.mark.integration



async def _url_in_etcd(etcd_client: EtcdClient, iid: str) -> str | None:
    kv = await etcd_client.get(f"{ROOT}/http/services/{AUTHORITY}_{iid}/loadBalancer/servers/000/url")
    return kv.value if kv else None


async def test_files_are_applied_hot_reloaded_and_bad_content_keeps_the_last_good(
    tmp_path: Path, reconciler: Reconciler, etcd_client: EtcdClient
) -> None:
    iid = uid()
    path = tmp_path / "routes.yaml"
    path.write_text(ingress_yaml(iid, 1, 8001))
    files = IngressFiles([str(tmp_path / "*.yaml")], reconciler)
    stop = asyncio.Event()
    await files.sync_all()
    watcher = asyncio.create_task(files.follow(stop))
    try:
        assert await _url_in_etcd(etcd_client, iid) == "http://127.0.0.1:8001"

        path.write_text(ingress_yaml(iid, 2, 8002))
        await eventually(lambda: _is(etcd_client, iid, "http://127.0.0.1:8002"))

        revision = await etcd_client.revision()
        path.write_text(ingress_yaml(iid, 3, 8003).replace("hosts:", "hostz:"))
        await eventually(lambda: _has_error(files, path))
        assert "hostz" in files.errors[path.resolve()]
        assert await _url_in_etcd(etcd_client, iid) == "http://127.0.0.1:8002"
        assert await etcd_client.revision() == revision  # nothing written

        path.write_text(ingress_yaml(iid, 3, 8003))
        await eventually(lambda: _is(etcd_client, iid, "http://127.0.0.1:8003"))
        assert path.resolve() not in files.errors

        path.unlink()
        await eventually(lambda: _is(etcd_client, iid, None))
        assert reconciler.store.get(IngressRef(AUTHORITY, iid)) is None
    finally:
        stop.set()
        await watcher


async def test_a_stale_revision_in_a_file_is_reported_not_applied(tmp_path: Path, reconciler: Reconciler, etcd_client: EtcdClient) -> None:
    iid = uid()
    path = tmp_path / "routes.yaml"
    path.write_text(ingress_yaml(iid, 5, 8001))
    files = IngressFiles([str(path)], reconciler)
    await files.sync_all()
    path.write_text(ingress_yaml(iid, 4, 8009))
    await files.sync_all()
    assert "lower than the stored 5" in files.errors[path.resolve()]
    assert await _url_in_etcd(etcd_client, iid) == "http://127.0.0.1:8001"
    path.unlink()
    await files.sync_all()
    assert await _url_in_etcd(etcd_client, iid) is None


async def _is(etcd_client: EtcdClient, iid: str, expected: str | None) -> bool:
    return await _url_in_etcd(etcd_client, iid) == expected


async def _has_error(files: IngressFiles, path: Path) -> bool:
    return path.resolve() in files.errors


async def test_a_changed_template_is_applied_to_every_ingress_and_a_broken_one_is_reported(
    tmp_path: Path, etcd: EmbeddedEtcd, etcd_client: EtcdClient, http: aiohttp.ClientSession
) -> None:
    from exporter.config import Settings
    from exporter.daemon import Daemon
    from exporter.embedded import free_port
    from exporter.render.renderer import BUILTIN_TEMPLATES

    templates = tmp_path / "templates"
    templates.mkdir()
    original = (BUILTIN_TEMPLATES / "http.json.j2").read_text()
    priority = '"priority": {{ priority }}'
    (templates / "http.json.j2").write_text(original)
    iid = uid()
    (tmp_path / "routes.yaml").write_text(ingress_yaml(iid, 1, 8001))
    records = uid("tpl")
    settings = Settings.model_validate({
        "etcd": {"endpoints": [etcd.url]}, "records_prefix": f"{records}/records",
        "sources": {"files": [str(tmp_path / "*.yaml")]}, "templates": {"dir": str(templates)},
        "api": {"enabled": False}, "control": {"listen": f"127.0.0.1:{free_port()}"}, "leader": {"enabled": False},
    })
    daemon = Daemon(settings)
    await daemon.start()
    key = f"{ROOT}/http/routers/{AUTHORITY}_{iid}/priority"
    try:
        await eventually(lambda: _value_is(etcd_client, key, "101"))
        (templates / "http.json.j2").write_text(original.replace(priority, '"priority": 4242'))
        await eventually(lambda: _value_is(etcd_client, key, "4242"))
        (templates / "http.json.j2").write_text(original.replace(priority, '"priority": "abc"'))
        await eventually(lambda: _not_ready(http, settings.control.listen, "http.json.j2"))
        kv = await etcd_client.get(key)
        assert kv is not None and kv.value == "4242"  # kept, never frozen
    finally:
        (tmp_path / "routes.yaml").unlink()
        (templates / "http.json.j2").write_text(original)
        await eventually(lambda: _value_is(etcd_client, key, None))
        await daemon.stop()
        await etcd_client.delete_prefix(f"{records}/")


async def _value_is(etcd_client: EtcdClient, key: str, expected: str | None) -> bool:
    kv = await etcd_client.get(key)
    return (kv.value if kv else None) == expected


async def _not_ready(http: aiohttp.ClientSession, listen: str, reason: str) -> bool:
    async with http.get(f"http://{listen}/readyz") as resp:
        return resp.status == 503 and reason in await resp.text()
