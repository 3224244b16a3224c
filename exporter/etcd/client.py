"""The exporter's etcd client: reads, transactions, leases and watches over gRPC (or the JSON gateway).

Python has no complete asyncio etcd client (docs/writer.md, "Talking to etcd"), so the daemon
speaks etcd's API itself: `GrpcKv` on etcd's gRPC services through `grpc.aio` with messages
generated from etcd's protobuf files (`proto/`), or `GatewayKv` on the v3 JSON gateway over aiohttp
(`etcd.transport: gateway`). Watch events of either are decoded only when looked into. Both
transports share one `Evidence` of reachability and one endpoint list.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Sequence
from typing import Literal, Protocol

import aiohttp
import orjson

from ..errors import EtcdError, WatchCanceled
from .channel import Channels
from .gateway import EtcdSecurity, Gateway, error_text
from .gateway_kv import GatewayKv
from .grpc_kv import GrpcKv
from .reach import Evidence, Reachability
from .types import Compare, KeyValue, Op, RangePage, TxnResult, WatchEvent, WatchLine, b64, b64_range_end

Transport = Literal["grpc", "gateway"]

# One watch response is one JSON line; a burst of large transactions can make it big.
_MAX_WATCH_LINE = 64 * 1024 * 1024


class Kv(Protocol):
    """What each transport sends: reads, transactions, unguarded writes for tools, leases."""

    async def get(self, key: str) -> KeyValue | None: ...
    async def get_at(self, key: str, revision: int = 0) -> tuple[KeyValue | None, int]: ...
    async def range_prefix(self, prefix: str, *, revision: int = 0) -> RangePage: ...
    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult: ...
    async def put(self, key: str, value: str) -> int: ...
    async def delete_prefix(self, prefix: str) -> int: ...
    async def delete(self, key: str) -> int: ...
    async def lease_grant(self, ttl: int) -> int: ...
    async def lease_keepalive(self, lease: int) -> int: ...
    async def lease_revoke(self, lease: int) -> None: ...
    async def revision(self) -> int: ...


class EtcdClient:
    """Range, txn, lease and watch against etcd (the first endpoint that answers)."""

    def __init__(
        self, endpoints: Sequence[str], timeout: float = 5.0, page_size: int = 5000, security: EtcdSecurity | None = None,
        transport: Transport = "grpc",
    ) -> None:
        self._evidence = Evidence()
        self._gateway = Gateway(endpoints, timeout, security, self._evidence)
        self._gateway_kv = GatewayKv(self._gateway, page_size)
        self._channels: Channels | None = None
        self._kv: Kv = self._gateway_kv
        if transport == "grpc":
            self._channels = Channels(endpoints, timeout, security or EtcdSecurity(), self._evidence)
            self._kv = GrpcKv(self._channels, page_size)

    @property
    def endpoint(self) -> str:
        """The endpoint requests go to now (the next one is tried when it fails)."""
        return self._channels.endpoint if self._channels is not None else self._gateway.endpoint

    def reachability(self) -> Reachability:
        """What the last request said about etcd."""
        return self._evidence.reachability()

    @property
    def tokens_issued(self) -> int:
        """Auth tokens obtained so far (with username/password: the first, and one per renewal)."""
        return self._gateway.tokens_issued + (self._channels.tokens_issued if self._channels is not None else 0)

    def idle_for(self) -> float:
        """Seconds since etcd last answered anything."""
        return self._evidence.idle_for()

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the gRPC channels and the HTTP session."""
        if self._channels is not None:
            await self._channels.close()
        await self._gateway.close()

    async def get(self, key: str) -> KeyValue | None:
        """One key, or None."""
        return await self._kv.get(key)

    async def get_at(self, key: str, revision: int = 0) -> tuple[KeyValue | None, int]:
        """One key (or None) as it was at `revision` (the current one when 0), and the revision read."""
        return await self._kv.get_at(key, revision)

    async def range_prefix(self, prefix: str, *, revision: int = 0) -> RangePage:
        """Every key under `prefix`, read in pages pinned to one revision (never one unbounded read)."""
        return await self._kv.range_prefix(prefix, revision=revision)

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        """Apply `ops` atomically if every compare holds."""
        return await self._kv.txn(compares, ops)

    async def put(self, key: str, value: str) -> int:
        """Unguarded put (tests, tools); returns the new revision."""
        return await self._kv.put(key, value)

    async def delete_prefix(self, prefix: str) -> int:
        """Unguarded delete of a prefix (tests, tools); returns the new revision."""
        return await self._kv.delete_prefix(prefix)

    async def delete(self, key: str) -> int:
        """Unguarded delete of one key (tests, tools); returns the new revision."""
        return await self._kv.delete(key)

    async def lease_grant(self, ttl: int) -> int:
        """A new lease of `ttl` seconds; returns its ID."""
        return await self._kv.lease_grant(ttl)

    async def lease_keepalive(self, lease: int) -> int:
        """Refresh a lease; returns its remaining TTL (0: it expired)."""
        return await self._kv.lease_keepalive(lease)

    async def lease_revoke(self, lease: int) -> None:
        """Revoke a lease (its keys are deleted)."""
        await self._kv.lease_revoke(lease)

    async def revision(self) -> int:
        """The current revision of the store."""
        return await self._kv.revision()

    async def probe_while_idle(self, every: float, silent_after: float) -> None:
        """Ask etcd for its revision whenever it has been quiet for `every` seconds, forever.

        Reachability must see an outage also while nothing is written (readiness reads it): etcd
        silent for `silent_after` seconds meanwhile counts as unreachable.
        """
        self._evidence.silent_after = silent_after
        while True:
            await asyncio.sleep(every / 2)
            if self.idle_for() >= every:
                with contextlib.suppress(EtcdError):
                    await self.revision()

    def watch_prefix(
        self, prefix: str, start_revision: int, idle_timeout: float, *, end: str | None = None
    ) -> AsyncIterator[list[WatchEvent]]:
        """Yield batches of events under `prefix` from `start_revision` on, over the client's transport.

        Raises WatchCanceled when etcd cancels (compaction), EtcdError when the stream breaks or
        stays silent longer than `idle_timeout` (after an etcd restart a stream can block forever).
        Progress notifications keep a healthy idle stream alive.
        """
        if isinstance(self._kv, GrpcKv):
            return self._kv.watch_prefix(prefix, start_revision, idle_timeout, end=end)
        return self._gateway_watch(prefix, start_revision, idle_timeout, end)

    async def _gateway_watch(
        self, prefix: str, start_revision: int, idle_timeout: float, end: str | None
    ) -> AsyncIterator[list[WatchEvent]]:
        body = {
            "create_request": {
                "key": b64(prefix),
                "range_end": b64(end) if end is not None else b64_range_end(prefix),
                "start_revision": str(start_revision),
                "progress_notify": True,
            }
        }
        gateway = self._gateway
        url = gateway.endpoint + "/v3/watch"
        timeout = aiohttp.ClientTimeout(total=None, sock_read=idle_timeout, connect=gateway.timeout)
        if gateway.authenticated:
            await self._gateway_kv.revision()  # refreshes the gateway's token if it expired
        try:
            async with gateway.session().post(url, json=body, timeout=timeout, **gateway.request_kwargs()) as resp:
                if resp.status != 200:
                    raise EtcdError(error_text(await resp.read(), resp.status), status=resp.status)
                while line := await resp.content.readline(max_line_length=_MAX_WATCH_LINE):
                    if events := _watch_events(line):
                        yield events
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            gateway.next_endpoint()
            error = EtcdError(f"watch on {url} broke: {type(exc).__name__}", unavailable=True)
            # A stream that stayed silent past its idle timeout says nothing about etcd; a broken connection does.
            raise (error if isinstance(exc, asyncio.TimeoutError) else gateway.failed(error)) from None
        gateway.next_endpoint()
        raise EtcdError(f"watch on {url} ended", unavailable=True)


# One per event of a watch message (the kv's own field; the header says "revision").
_MOD_REVISION = re.compile(rb'"mod_revision":"(\d+)"')


def _watch_events(line: bytes) -> list[WatchEvent]:
    """The events of one watch message, left undecoded; raises WatchCanceled when etcd canceled the watch."""
    if b'"canceled":true' in line:
        result = orjson.loads(line).get("result", {})
        raise WatchCanceled(result.get("cancel_reason", "watch canceled"), int(result.get("compact_revision", 0)))
    if b'"events"' not in line:
        return []  # a progress notification, or the creation ack
    shared = WatchLine(line)
    return [WatchEvent((shared, i), int(rev)) for i, rev in enumerate(_MOD_REVISION.findall(line))]


