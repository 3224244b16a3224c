"""etcd's reads, transactions and leases over its gRPC API (`Channels`), as etcd's own clients send them.

The gateway would decode each request from JSON and base64 inside etcd, send it again to etcd's
own gRPC port and encode the answer back: over gRPC etcd spends about a third of the CPU per
transaction (docs/writer.md, "Talking to etcd").
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from ..errors import WatchCanceled
from .channel import Channels
from .proto import kv_pb2, rpc_pb2
from .types import Compare, KeyValue, Op, RangePage, TxnResult, WatchEvent, range_end
from .wire import txn_request

_RANGE = "/etcdserverpb.KV/Range"
_WATCH = "/etcdserverpb.Watch/Watch"


class GrpcKv:
    """Range, txn, put, delete and leases on etcd's gRPC services."""

    def __init__(self, channels: Channels, page_size: int) -> None:
        self.channels = channels
        self._page_size = page_size

    async def get(self, key: str) -> KeyValue | None:
        """One key, or None."""
        reply = await self._range(rpc_pb2.RangeRequest(key=key.encode()))
        return _kv(reply.kvs[0]) if reply.kvs else None

    async def get_at(self, key: str, revision: int = 0) -> tuple[KeyValue | None, int]:
        """One key (or None) as it was at `revision` (the current one when 0), and the revision read."""
        reply = await self._range(rpc_pb2.RangeRequest(key=key.encode(), revision=revision))
        return (_kv(reply.kvs[0]) if reply.kvs else None), revision or reply.header.revision

    async def range_prefix(self, prefix: str, *, revision: int = 0) -> RangePage:
        """Every key under `prefix`, read in pages pinned to one revision (never one unbounded read)."""
        page = RangePage(revision=revision)
        start, end = prefix.encode(), range_end(prefix)
        while True:
            reply = await self._range(rpc_pb2.RangeRequest(key=start, range_end=end, limit=self._page_size, revision=revision))
            if not revision:
                revision = page.revision = reply.header.revision
            page.kvs.extend(_kv(kv) for kv in reply.kvs)
            if not reply.more or not reply.kvs:
                return page
            start = reply.kvs[-1].key + b"\x00"

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        """Apply `ops` atomically if every compare holds (sent once: never to a second endpoint)."""
        reply = await self.channels.call(
            "/etcdserverpb.KV/Txn", txn_request(compares, ops), rpc_pb2.TxnResponse.FromString, unsafe=True, serialize=bytes,
        )
        return TxnResult(succeeded=reply.succeeded, revision=reply.header.revision)

    async def put(self, key: str, value: str) -> int:
        """Unguarded put (tests, tools); returns the new revision."""
        request = rpc_pb2.PutRequest(key=key.encode(), value=value.encode())
        reply = await self.channels.call("/etcdserverpb.KV/Put", request, rpc_pb2.PutResponse.FromString, unsafe=True)
        return reply.header.revision

    async def delete_prefix(self, prefix: str) -> int:
        """Unguarded delete of a prefix (tests, tools); returns the new revision."""
        return await self._delete(rpc_pb2.DeleteRangeRequest(key=prefix.encode(), range_end=range_end(prefix)))

    async def delete(self, key: str) -> int:
        """Unguarded delete of one key (tests, tools); returns the new revision."""
        return await self._delete(rpc_pb2.DeleteRangeRequest(key=key.encode()))

    async def lease_grant(self, ttl: int) -> int:
        """A new lease of `ttl` seconds; returns its ID."""
        reply = await self.channels.call(
            "/etcdserverpb.Lease/LeaseGrant", rpc_pb2.LeaseGrantRequest(TTL=ttl), rpc_pb2.LeaseGrantResponse.FromString,
        )
        return reply.ID

    async def lease_keepalive(self, lease: int) -> int:
        """Refresh a lease; returns its remaining TTL (0: it expired)."""
        reply = await self.channels.call_streamed(
            "/etcdserverpb.Lease/LeaseKeepAlive", rpc_pb2.LeaseKeepAliveRequest(ID=lease),
            rpc_pb2.LeaseKeepAliveResponse.FromString,
        )
        return reply.TTL

    async def lease_revoke(self, lease: int) -> None:
        """Revoke a lease (its keys are deleted)."""
        await self.channels.call(
            "/etcdserverpb.Lease/LeaseRevoke", rpc_pb2.LeaseRevokeRequest(ID=lease), rpc_pb2.LeaseRevokeResponse.FromString,
        )

    async def revision(self) -> int:
        """The current revision of the store."""
        reply = await self._range(rpc_pb2.RangeRequest(key=b"\x00", keys_only=True, limit=1))
        return reply.header.revision

    async def watch_prefix(
        self, prefix: str, start_revision: int, idle_timeout: float, *, end: str | None = None
    ) -> AsyncIterator[list[WatchEvent]]:
        """Yield batches of events under `prefix` from `start_revision` on.

        Raises WatchCanceled when etcd cancels (compaction), EtcdError when the stream breaks or
        stays silent longer than `idle_timeout`. Progress notifications keep a healthy idle
        stream alive. An event is decoded only when its key or value is read.
        """
        if self.channels.authenticated:
            await self.revision()  # renews the token if it expired
        last = end.encode() if end is not None else range_end(prefix)
        create = rpc_pb2.WatchCreateRequest(key=prefix.encode(), range_end=last, start_revision=start_revision,
                                            progress_notify=True)
        responses = self.channels.stream(_WATCH, rpc_pb2.WatchRequest(create_request=create), rpc_pb2.WatchResponse.FromString,
                                         idle_timeout)
        async for response in responses:
            if response.canceled:
                raise WatchCanceled(response.cancel_reason or "watch canceled", response.compact_revision)
            if response.events:
                yield [WatchEvent(event, event.kv.mod_revision) for event in response.events]

    async def _range(self, request: rpc_pb2.RangeRequest) -> rpc_pb2.RangeResponse:
        return await self.channels.call(_RANGE, request, rpc_pb2.RangeResponse.FromString)

    async def _delete(self, request: rpc_pb2.DeleteRangeRequest) -> int:
        reply = await self.channels.call(
            "/etcdserverpb.KV/DeleteRange", request, rpc_pb2.DeleteRangeResponse.FromString, unsafe=True,
        )
        return reply.header.revision


def _kv(kv: kv_pb2.KeyValue) -> KeyValue:
    return KeyValue(kv.key.decode(), kv.value.decode(), kv.mod_revision, kv.create_revision)
