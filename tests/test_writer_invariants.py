"""The write invariants on a real etcd and Traefik: history replay, idle reconcile, guards, drift."""

from __future__ import annotations

from typing import Any

import pytest

from exporter.daemon import build_reconciler
from exporter.embedded import EmbeddedEtcd, EmbeddedTraefik
from exporter.errors import StaleRevisionError
from exporter.etcd.client import EtcdClient
from exporter.reconciler import Reconciler
from exporter.write import metrics
from tests.conftest import ROOT, settings_for
from tests.helpers import (
    AUTHORITY,
    Backend,
    eventually,
    get_via,
    record,
    router_enabled,
    uid,
)
from tests.replay import replay

pytestmark = pytest.mark.integration


def servers(*backends: Backend) -> dict[str, Any]:
    return {"servers": [{"url": b.url} for b in backends]}


async def serves(http, traefik: EmbeddedTraefik, host: str, body: str | None) -> bool:  # type: ignore[no-untyped-def]
    status, text = await get_via(http, traefik.url("web"), host)
    if body is None:
        return status == 404
    return status == 200 and text == body


async def test_history_replay_has_no_dangling_reference_at_any_revision(
    ingresses, backends, etcd: EmbeddedEtcd, etcd_client, traefik, http
) -> None:
    a, b, c = [await Backend(n).start() for n in "abc"]
    backends.extend([a, b, c])
    start = await etcd_client.revision()
    one, two = uid(), uid()
    await ingresses.upsert(record(one, upstream=servers(a)), record(two, upstream=servers(b), allowed_client_ips=["127.0.0.0/8"]))
    # canary on, server list change, canary off, middleware off, then delete
    await ingresses.upsert(record(one, revision=2, upstream=servers(a), canary={"weight": 50, "upstream": servers(c)}))
    await ingresses.upsert(record(one, revision=3, upstream=servers(a, b), canary={"weight": 50, "upstream": servers(c)}))
    await ingresses.upsert(record(one, revision=4, upstream=servers(b)))
    await ingresses.upsert(record(two, revision=2, upstream=servers(c)))
    await eventually(lambda: serves(http, traefik, f"{one}.test", "b"))
    await eventually(lambda: serves(http, traefik, f"{two}.test", "c"))
    await ingresses.remove((AUTHORITY, two))
    await eventually(lambda: serves(http, traefik, f"{two}.test", None))
    violations, checked = await replay(etcd.url, ROOT, start)
    assert violations == []
    assert checked >= 6  # one request (root keys + 2 creates), 4 updates, 1 delete: a revision each


async def test_idle_reconcile_with_200_ingresses_adds_no_revision(ingresses, reconciler: Reconciler, etcd_client) -> None:
    ids = [uid() for _ in range(200)]
    await ingresses.upsert(*(record(i, upstream={"servers": [{"url": "http://127.0.0.1:9"}]}) for i in ids))
    before = await etcd_client.revision()
    for relist in (False, True, False, True, False):
        passes = reconciler.status.full_passes
        reconciler.request_full(relist=relist)
        await eventually(lambda: _passed(reconciler, passes))
    # Re-submitting the same revisions (a coordinator retry) is a no-op too.
    await ingresses.upsert(*(record(i, upstream={"servers": [{"url": "http://127.0.0.1:9"}]}) for i in ids[:20]))
    assert await etcd_client.revision() == before


async def test_a_foreign_edit_between_plan_and_commit_fails_the_txn_and_replans(
    ingresses, reconciler: Reconciler, etcd_client, traefik, http, backends
) -> None:
    backends.append(await Backend("mine").start())
    iid = uid()
    await ingresses.upsert(record(iid, upstream=servers(backends[0])))
    rule_key = f"{ROOT}/http/routers/{AUTHORITY}_{iid}/rule"
    writer_client = reconciler._writer._etcd
    real_txn = writer_client.txn
    calls = []

    async def intercept(compares, ops):  # type: ignore[no-untyped-def]
        if not calls:
            calls.append(1)
            await etcd_client.put(rule_key, "Host(`hijacked.test`)")
        return await real_txn(compares, ops)

    conflicts = metrics.TXNS.labels("conflict")._value.get()
    writer_client.txn = intercept
    try:
        await ingresses.upsert(record(iid, revision=2, upstream=servers(backends[0]), path_prefix="/v2"))
    finally:
        writer_client.txn = real_txn
    assert metrics.TXNS.labels("conflict")._value.get() == conflicts + 1
    assert (await etcd_client.get(rule_key)).value == f"Host(`{iid}.test`) && PathPrefix(`/v2`)"
    await eventually(lambda: _status(http, traefik, f"{iid}.test", "/v2/x", 200))


async def test_a_stale_writer_loses_to_a_newer_revision_committed_meanwhile(
    ingresses, reconciler: Reconciler, etcd: EmbeddedEtcd, etcd_client
) -> None:
    iid = uid()
    await ingresses.upsert(record(iid, upstream={"servers": [{"url": "http://127.0.0.1:8001"}]}))
    async with EtcdClient([etcd.url]) as peer_client:
        peer = build_reconciler(settings_for(etcd.url), peer_client)
        await peer.start()
        await peer.wait_synced(20)
        writer_client = reconciler._writer._etcd
        real_txn = writer_client.txn
        newer = record(iid, revision=3, upstream={"servers": [{"url": "http://127.0.0.1:8003"}]})

        async def peer_first(compares, ops):  # type: ignore[no-untyped-def]
            writer_client.txn = real_txn
            await peer.submit([newer])
            return await real_txn(compares, ops)

        writer_client.txn = peer_first
        try:
            with pytest.raises(StaleRevisionError) as info:
                await reconciler.submit([record(iid, revision=2, upstream={"servers": [{"url": "http://127.0.0.1:8002"}]})])
        finally:
            writer_client.txn = real_txn
            await peer.stop()
    assert info.value.data["stored_revision"] == 3
    url = await etcd_client.get(f"{ROOT}/http/services/{AUTHORITY}_{iid}/loadBalancer/servers/000/url")
    assert url.value == "http://127.0.0.1:8003"
    assert reconciler.store.get((AUTHORITY, iid)).revision == 3  # type: ignore[union-attr]
    ingresses.owned[(AUTHORITY, iid)] = 3


async def test_drift_is_repaired_and_foreign_keys_are_left_alone(
    ingresses, reconciler: Reconciler, etcd_client, traefik, http, backends
) -> None:
    backends.append(await Backend("drift").start())
    iid = uid()
    await ingresses.upsert(record(iid, upstream=servers(backends[0])))
    name = f"{AUTHORITY}_{iid}"
    rule_key = f"{ROOT}/http/routers/{name}/rule"
    url_key = f"{ROOT}/http/services/{name}/loadBalancer/servers/000/url"
    foreign = f"{ROOT}/http/middlewares/foreign-{iid}/headers/customRequestHeaders/X-Foreign"
    await etcd_client.put(foreign, "1")
    try:
        await etcd_client.delete(url_key)
        await etcd_client.put(rule_key, "Host(`edited.test`)")
        await etcd_client.put(f"{ROOT}/http/routers/{name}/priority", "7")
        await eventually(lambda: _value(etcd_client, url_key, backends[0].url))
        await eventually(lambda: _value(etcd_client, rule_key, f"Host(`{iid}.test`)"))
        await eventually(lambda: _value(etcd_client, f"{ROOT}/http/routers/{name}/priority", "101"))
        await eventually(lambda: serves(http, traefik, f"{iid}.test", "drift"))
        await router_enabled(http, traefik.api, name)
        reconciler.request_full()
        await eventually(lambda: _foreign_reported(reconciler))
        assert (await etcd_client.get(foreign)).value == "1"  # type: ignore[union-attr]
    finally:
        await etcd_client.delete(foreign)


async def _passed(reconciler: Reconciler, passes: int) -> bool:
    return reconciler.status.full_passes > passes


async def _value(etcd_client: EtcdClient, key: str, expected: str) -> bool:
    kv = await etcd_client.get(key)
    return kv is not None and kv.value == expected


async def _foreign_reported(reconciler: Reconciler) -> bool:
    return reconciler.status.foreign_keys >= 1


async def _status(http, traefik, host: str, path: str, expected: int) -> bool:  # type: ignore[no-untyped-def]
    return (await get_via(http, traefik.url("web"), host, path))[0] == expected
