"""etcd's limits per transaction are detected, not assumed: probes write nothing, the writer packs to them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from loguru import logger

from exporter.embedded import EmbeddedEtcd, start_etcd
from exporter.etcd.client import EtcdClient
from exporter.etcd.limits import MAX_BYTES_PROBED, MAX_OPS_PROBED, EtcdLimits, detect_limits
from exporter.keys import KeyLayout
from exporter.plan.planner import Planner
from exporter.reconcile import Cadence, Reconciler
from exporter.render.renderer import Renderer
from exporter.render.root_keys import generate_certificate
from tests.conftest import settings_for
from tests.fake_etcd import FakeEtcd
from tests.helpers import eventually, record, uid

KEY = "records.limits-probe"


@pytest.mark.parametrize(("ops", "request_bytes"), [(128, 1536 * 1024), (1000, 8 * 1024 * 1024), (200_000, 1536 * 1024)])
async def test_detected_on_the_fake_as_etcd_reports_them(ops: int, request_bytes: int) -> None:
    etcd = FakeEtcd(max_txn_ops=ops, max_request_bytes=request_bytes)
    assert await detect_limits(etcd, KEY) == EtcdLimits(min(ops, MAX_OPS_PROBED), request_bytes)
    assert etcd.revision == 1 and not etcd.keys()  # compares only: nothing written, no revision


@pytest.fixture(scope="module")
async def roomy_etcd(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedEtcd]:
    """An etcd with raised limits smaller than the recommended ones (the session etcd has those)."""
    etcd = start_etcd(Path(tmp_path_factory.mktemp("roomy")), ["--max-txn-ops", "1000", "--max-request-bytes", str(8 * 1024 * 1024)])
    yield etcd
    etcd.stop()


@pytest.fixture(scope="module")
async def default_etcd(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedEtcd]:
    """An etcd with its own default limits."""
    etcd = start_etcd(Path(tmp_path_factory.mktemp("default")))
    yield etcd
    etcd.stop()


@pytest.mark.integration
async def test_detected_on_a_real_etcd_with_its_default_and_raised_limits(
    etcd: EmbeddedEtcd, roomy_etcd: EmbeddedEtcd, default_etcd: EmbeddedEtcd
) -> None:
    cases = (
        (default_etcd, EtcdLimits(128, 1536 * 1024)), (roomy_etcd, EtcdLimits(1000, 8 * 1024 * 1024)),
        (etcd, EtcdLimits(MAX_OPS_PROBED, MAX_BYTES_PROBED)),  # the recommended 64 MiB: as far as the probe goes
    )
    for server, expected in cases:
        async with EtcdClient([server.url]) as client:
            before = await client.revision()
            assert await detect_limits(client, KEY) == expected
            assert await client.revision() == before


@pytest.mark.integration
async def test_the_writer_packs_to_what_etcd_accepts(roomy_etcd: EmbeddedEtcd) -> None:
    from exporter.assembly import build_reconciler

    async with EtcdClient([roomy_etcd.url]) as client:
        rec = build_reconciler(settings_for(roomy_etcd.url, records_prefix=f"{uid('lim')}/records"), client)
        await rec.start()
        try:
            await rec.wait_synced(20)
            assert rec.detected == EtcdLimits(1000, 8 * 1024 * 1024)
            before = await client.revision()
            # 90 ingresses, their keys and records and a beacon: one transaction of 991 operations (eight of 128).
            await rec.submit([record(uid(), upstream={"servers": [{"url": "http://127.0.0.1:9"}]}) for _ in range(90)])
            assert await client.revision() - before == 1
        finally:
            await rec.stop()


async def test_a_large_root_with_etcds_default_limits_is_told_which_flags_help() -> None:
    layout = KeyLayout("traefik/worker_{authority}", "records")
    etcd = FakeEtcd()
    rec = Reconciler(etcd=etcd, layout=layout, planner=Planner(Renderer(layout, ["web"]), layout, generate_certificate()),
                     cadence=Cadence(coalesce_window=0.0, reconcile_interval=3600))
    await rec.start()
    try:
        await rec.wait_synced(5)
        up = {"servers": [{"url": "http://127.0.0.1:9"}]}
        await rec.submit([record(f"i{n}", upstream=up) for n in range(1000)])
        assert rec.advice.limits() is None  # 1,000: not yet
        await rec.submit([record("i1000", upstream=up)])
        advice = rec.advice.limits()
        assert advice is not None and advice.startswith("root traefik/worker_test holds 1001 ingresses: with etcd's --max-txn-ops 128")
        assert "--max-txn-ops 100000 --max-request-bytes 67108864" in advice
    finally:
        await rec.stop()


async def test_roots_that_are_prefixes_of_each_other_are_warned_of_once() -> None:
    lines: list[str] = []
    sink = logger.add(lambda message: lines.append(str(message)), level="WARNING", format="{message}")
    layout = KeyLayout("traefik/worker_{authority}", "records")
    rec = Reconciler(etcd=FakeEtcd(), layout=layout, planner=Planner(Renderer(layout, ["web"]), layout, generate_certificate()),
                     cadence=Cadence(coalesce_window=0.0, reconcile_interval=3600))
    await rec.start()
    try:
        await rec.wait_synced(5)
        up = {"servers": [{"url": "http://127.0.0.1:9"}]}
        await rec.submit([record("a", authority="1", upstream=up), record("b", authority="10", upstream=up)])
        for _ in range(2):
            passes = rec.status.full_passes
            rec.request_full()
            await eventually(lambda: _passed(rec, passes))
        told = [line for line in lines if "is a string prefix of root" in line]
        assert len(told) == 1 and told[0].startswith("root traefik/worker_1 is a string prefix of root traefik/worker_10")
    finally:
        logger.remove(sink)
        await rec.stop()


async def _passed(rec: Reconciler, passes: int) -> bool:
    return rec.status.full_passes > passes
