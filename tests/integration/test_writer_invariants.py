"""The write invariants on a real etcd and Traefik: history replay, idle reconcile, guards, drift."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from exporter.assembly import build_reconciler
from exporter.embedded import EmbeddedEtcd, EmbeddedTraefik
from exporter.errors import StaleRevisionError
from exporter.etcd.client import EtcdClient
from exporter.keys import IngressRef
from exporter.reconcile import Reconciler
from exporter.store.records import Removal
from tests.conftest import ROOT, Ingresses, settings_for
from tests.helpers import (
    AUTHORITY,
    Backend,
    HookedEtcd,
    eventually,
    record,
    router_enabled,
    serves,
    uid,
)
from tests.replay import replay

pytestmark = pytest.mark.integration


def servers(*backends: Backend) -> dict[str, Any]:
    return {"servers": [{"url": b.url} for b in backends]}


async def test_history_replay_has_no_dangling_reference_at_any_revision(
    ingresses: Ingresses, backends: list[Backend], etcd: EmbeddedEtcd, etcd_client: EtcdClient, traefik: EmbeddedTraefik,
    http: aiohttp.ClientSession,
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
    await eventually(lambda: serves(http, traefik.url("web"), f"{one}.test", body="b"))
    await eventually(lambda: serves(http, traefik.url("web"), f"{two}.test", body="c"))
    await ingresses.remove((AUTHORITY, two))
    await eventually(lambda: serves(http, traefik.url("web"), f"{two}.test", status=404))
    violations, checked = await replay(etcd.url, ROOT, start)
    assert violations == []
    assert checked >= 6  # one request (root keys + 2 creates), 4 updates, 1 delete: a revision each


async def test_idle_reconcile_with_200_ingresses_adds_no_revision(
    ingresses: Ingresses, reconciler: Reconciler, etcd_client: EtcdClient
) -> None:
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


@contextlib.asynccontextmanager
async def hooked_reconciler(etcd_url: str, records: str) -> AsyncIterator[tuple[Reconciler, HookedEtcd]]:
    """A reconciler of its own (records under `records`) whose transactions can be preceded by a hook."""
    async with EtcdClient([etcd_url]) as client:
        hooked = HookedEtcd(client)
        rec = build_reconciler(settings_for(etcd_url, records_prefix=records), hooked)
        await rec.start()
        await rec.wait_synced(20)
        try:
            yield rec, hooked
        finally:
            await rec.stop()


async def test_a_foreign_edit_between_plan_and_commit_is_repaired_once_the_watch_brings_it(
    etcd: EmbeddedEtcd, etcd_client: EtcdClient, traefik: EmbeddedTraefik, http: aiohttp.ClientSession,
    backends: list[Backend],
) -> None:
    # The mirror holds every key committed with the record, so the record compare alone guards
    # the push: it commits, and the key another writer changed meanwhile is drift, repaired.
    backends.append(await Backend("mine").start())
    iid = uid()
    rule_key = f"{ROOT}/http/routers/{AUTHORITY}_{iid}/rule"
    url_key = f"{ROOT}/http/services/{AUTHORITY}_{iid}/loadBalancer/servers/000/url"
    async with hooked_reconciler(etcd.url, f"{uid('fe')}/records") as (rec, hooked):
        await rec.submit([record(iid, upstream=servers(backends[0]))])

        async def hijack() -> None:
            await etcd_client.put(url_key, "http://127.0.0.1:9")

        conflicts = rec.metrics.value("exporter_etcd_txns_total", {"result": "conflict"})
        hooked.before_txn = hijack
        await rec.submit([record(iid, revision=2, upstream=servers(backends[0]), path_prefix="/v2")])
        assert rec.metrics.value("exporter_etcd_txns_total", {"result": "conflict"}) == conflicts
        kv = await etcd_client.get(rule_key)
        assert kv is not None and kv.value == f"Host(`{iid}.test`) && PathPrefix(`/v2`)"
        await eventually(lambda: _value(etcd_client, url_key, backends[0].url))
        await eventually(lambda: serves(http, traefik.url("web"), f"{iid}.test", path="/v2/x"))
        await rec.submit([], [Removal(IngressRef(AUTHORITY, iid), 3)])


async def test_a_foreign_key_written_into_an_object_being_created_is_repaired(
    etcd: EmbeddedEtcd, etcd_client: EtcdClient, backends: list[Backend],
) -> None:
    # A new object carries no range compare (only the record's): the creation commits, and the
    # foreign key that slipped in is seen by the watch and removed like any drift.
    backends.append(await Backend("mine").start())
    iid = uid()
    foreign = f"{ROOT}/http/routers/{AUTHORITY}_{iid}/observability/metrics"  # no template writes it
    async with hooked_reconciler(etcd.url, f"{uid('fc')}/records") as (rec, hooked):

        async def slip_in() -> None:
            await etcd_client.put(foreign, "false")

        hooked.before_txn = slip_in
        await rec.submit([record(iid, upstream=servers(backends[0]))])
        await eventually(lambda: _absent(etcd_client, foreign))
        assert await etcd_client.get(f"{ROOT}/http/routers/{AUTHORITY}_{iid}/rule") is not None
        await rec.submit([], [Removal(IngressRef(AUTHORITY, iid), 2)])


async def test_an_edit_another_writer_makes_in_the_middle_of_a_bulk_is_repaired(etcd: EmbeddedEtcd, etcd_client: EtcdClient) -> None:
    # 1,000 ingresses in one request are written with the watch running (docs/writer.md, "No pause
    # for a bulk"): an edit slipped in between two of the bulk's transactions is a revision that
    # is not ours, applied in order among ours, and repaired as drift.
    authority = uid("bulk")
    root = f"traefik/worker_{authority}"  # not the root the session's Traefik reads
    ids = sorted(uid() for _ in range(1000))
    rule_key, rule = f"{root}/http/routers/{authority}_{ids[0]}/rule", f"Host(`{ids[0]}.test`)"
    upstream = {"servers": [{"url": "http://127.0.0.1:9"}]}
    calls = 0
    async with hooked_reconciler(etcd.url, f"{uid('bk')}/records") as (rec, hooked):

        async def edit_mid_bulk() -> None:
            nonlocal calls
            calls += 1
            if calls < 3:
                hooked.before_txn = edit_mid_bulk
                return
            await eventually(lambda: _value(etcd_client, rule_key, rule))  # the first ingress is in
            await etcd_client.put(rule_key, "Host(`edited.test`)")

        try:
            # The root exists first: the bulk's first transaction then carries only ingresses.
            seed = uid()
            await rec.submit([record(seed, authority=authority, upstream=upstream)])
            hooked.before_txn = edit_mid_bulk
            await rec.submit([record(i, authority=authority, upstream=upstream) for i in ids])
            assert calls == 3
            await eventually(lambda: _value(etcd_client, rule_key, rule))
            # The watches resumed: a later edit is seen and repaired too.
            await etcd_client.put(rule_key, "Host(`again.test`)")
            await eventually(lambda: _value(etcd_client, rule_key, rule))
            await rec.submit([], [Removal(IngressRef(authority, i), 1) for i in [seed, *ids]])
        finally:
            await etcd_client.delete_prefix(root + "/")


async def _absent(client: EtcdClient, key: str) -> bool:
    return await client.get(key) is None


async def test_a_stale_writer_loses_to_a_newer_revision_committed_meanwhile(etcd: EmbeddedEtcd, etcd_client: EtcdClient) -> None:
    iid = uid()
    records = f"{uid('st')}/records"
    async with hooked_reconciler(etcd.url, records) as (rec, hooked):
        await rec.submit([record(iid, upstream={"servers": [{"url": "http://127.0.0.1:8001"}]})])
        async with hooked_reconciler(etcd.url, records) as (peer, _):
            newer = record(iid, revision=3, upstream={"servers": [{"url": "http://127.0.0.1:8003"}]})

            async def peer_first() -> None:
                await peer.submit([newer])

            hooked.before_txn = peer_first
            with pytest.raises(StaleRevisionError) as info:
                await rec.submit([record(iid, revision=2, upstream={"servers": [{"url": "http://127.0.0.1:8002"}]})])
        assert info.value.data["stored_revision"] == 3
        url = await etcd_client.get(f"{ROOT}/http/services/{AUTHORITY}_{iid}/loadBalancer/servers/000/url")
        assert url is not None and url.value == "http://127.0.0.1:8003"
        stored = rec.store.get(IngressRef(AUTHORITY, iid))
        assert stored is not None and stored.revision == 3
        await rec.submit([], [Removal(IngressRef(AUTHORITY, iid), 4)])


async def test_drift_is_repaired_and_foreign_keys_are_left_alone(
    ingresses: Ingresses, reconciler: Reconciler, etcd_client: EtcdClient, traefik: EmbeddedTraefik, http: aiohttp.ClientSession,
    backends: list[Backend],
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
        await eventually(lambda: serves(http, traefik.url("web"), f"{iid}.test", body="drift"))
        await router_enabled(http, traefik.api, name)
        reconciler.request_full()
        await eventually(lambda: _foreign_reported(reconciler))
        kv = await etcd_client.get(foreign)
        assert kv is not None and kv.value == "1"
    finally:
        await etcd_client.delete(foreign)


async def _passed(reconciler: Reconciler, passes: int) -> bool:
    return reconciler.status.full_passes > passes


async def _value(etcd_client: EtcdClient, key: str, expected: str) -> bool:
    kv = await etcd_client.get(key)
    return kv is not None and kv.value == expected


async def _foreign_reported(reconciler: Reconciler) -> bool:
    return reconciler.status.foreign_keys >= 1
