"""The gRPC transport's failover rules on a real etcd: a transaction is sent to a second endpoint
only when it never left; reads fail over whatever happened.

The first endpoint is a loopback link to the etcd that can be cut as a partition cuts (held
bytes, no answer: tests/campaign/link.py); the second is the same etcd, direct.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from exporter.embedded import EmbeddedEtcd, free_port
from exporter.errors import EtcdError
from exporter.etcd.client import EtcdClient
from exporter.etcd.types import Compare, Op
from tests.campaign.link import UP, Link
from tests.helpers import uid

pytestmark = pytest.mark.integration


@pytest.fixture
async def link(etcd: EmbeddedEtcd) -> AsyncIterator[Link]:
    cut = Link(free_port(), etcd.client_port)
    await cut.start()
    yield cut
    await cut.close()


async def test_a_transaction_that_may_have_left_is_not_sent_again_and_reads_fail_over(
    link: Link, etcd: EmbeddedEtcd, etcd_client: EtcdClient,
) -> None:
    key = f"grpc-failover/{uid()}"
    async with EtcdClient([link.url, etcd.url], timeout=1.0) as client:
        await client.revision()  # the channel through the link is up
        assert client.endpoint == link.url
        link.partition()
        with pytest.raises(EtcdError) as failed:
            await client.txn([Compare(key, "EQUAL", 0, target="CREATE")], [Op(key, "once")])
        assert failed.value.unavailable
        # Held by the partition: not committed, and not sent to the second endpoint either.
        assert await etcd_client.get(key) is None
        # A read is safe to repeat: it goes to the next endpoint and is answered.
        assert await client.revision() > 0 and client.endpoint == etcd.url
        link.heal()


async def test_a_transaction_that_never_left_goes_to_the_next_endpoint(etcd: EmbeddedEtcd, etcd_client: EtcdClient) -> None:
    key = f"grpc-failover/{uid()}"
    nobody = f"http://127.0.0.1:{free_port()}"
    async with EtcdClient([nobody, etcd.url], timeout=1.0) as client:
        result = await client.txn([Compare(key, "EQUAL", 0, target="CREATE")], [Op(key, "once")])
        assert result.succeeded and client.endpoint == etcd.url
    written = await etcd_client.get(key)
    assert written is not None and written.value == "once" and written.mod_revision == written.create_revision
    await etcd_client.delete(key)


async def test_etcd_that_stops_answering_is_unreachable_before_any_request_times_out(link: Link) -> None:
    async with EtcdClient([link.url], timeout=30.0) as client:
        probe = asyncio.create_task(client.probe_while_idle(0.2, silent_after=1.0))
        try:
            await client.revision()
            assert client.reachability().reachable is True
            link.partition(frozenset({UP}))  # the requests are held; no reply comes, no error either
            deadline = time.monotonic() + 10
            while client.reachability().reachable is not False:
                assert time.monotonic() < deadline, "still reachable, 10 s into the silence"
                await asyncio.sleep(0.05)
            assert "no answer for" in (client.reachability().error or "")
            link.heal()
            while client.reachability().reachable is not True:
                assert time.monotonic() < deadline + 30, "still unreachable after the heal"
                await asyncio.sleep(0.05)
        finally:
            probe.cancel()
