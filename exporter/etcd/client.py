"""A small asyncio client of etcd's v3 gRPC-gateway JSON API, on aiohttp.

etcd3gw is synchronous with no default timeout and silent watch failures
(docs/writer.md, "Talking to etcd"), so the daemon talks to the same gateway directly: full control of
compares, `header.revision`, paging (`more`), watch resume and error codes. Reaching the
gateway (failover, TLS, tokens, reachability) is `gateway.Gateway`'s job.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import orjson

from ..errors import EtcdError, WatchCanceled
from .gateway import EtcdSecurity, Gateway, Reachability, error_text
from .types import (
    Compare,
    KeyValue,
    Op,
    RangePage,
    TxnResult,
    WatchEvent,
    WatchLine,
    b64,
    b64_range_end,
    kv_of,
    txn_body,
)

# One watch response is one JSON line; a burst of large transactions can make it big.
_MAX_WATCH_LINE = 64 * 1024 * 1024


class EtcdClient:
    """Range, txn, lease and watch against etcd's gateway (the first endpoint that answers)."""

    def __init__(
        self, endpoints: Sequence[str], timeout: float = 5.0, page_size: int = 5000, security: EtcdSecurity | None = None
    ) -> None:
        self._gateway = Gateway(endpoints, timeout, security)
        self._page_size = page_size

    @property
    def endpoint(self) -> str:
        """The endpoint requests go to now (the next one is tried when it fails)."""
        return self._gateway.endpoint

    def reachability(self) -> Reachability:
        """What the last request said about etcd."""
        return self._gateway.reachability()

    @property
    def tokens_issued(self) -> int:
        """Auth tokens obtained so far (with username/password: the first, and one per renewal)."""
        return self._gateway.tokens_issued

    def idle_for(self) -> float:
        """Seconds since etcd last answered anything."""
        return self._gateway.idle_for()

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP session."""
        await self._gateway.close()

    async def get(self, key: str) -> KeyValue | None:
        """One key, or None."""
        reply = await self._gateway.post("/v3/kv/range", {"key": b64(key)})
        kvs = reply.get("kvs") or []
        return kv_of(kvs[0]) if kvs else None

    async def range_prefix(self, prefix: str, *, revision: int = 0) -> RangePage:
        """Every key under `prefix`, read in pages pinned to one revision (never one unbounded read)."""
        page = RangePage()
        start = b64(prefix)
        end = b64_range_end(prefix)
        while True:
            body: dict[str, Any] = {"key": start, "range_end": end, "limit": str(self._page_size)}
            if revision:
                body["revision"] = str(revision)
            reply = await self._gateway.post("/v3/kv/range", body)
            if not revision:
                revision = int(reply["header"]["revision"])
                page.revision = revision
            kvs = reply.get("kvs") or []
            page.kvs.extend(kv_of(kv) for kv in kvs)
            if not reply.get("more") or not kvs:
                return page
            start = base64.b64encode(base64.b64decode(kvs[-1]["key"]) + b"\x00").decode()

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        """Apply `ops` atomically if every compare holds."""
        reply = await self._gateway.post("/v3/kv/txn", txn_body(compares, ops))
        # The gateway omits `succeeded` when it is false.
        return TxnResult(succeeded=bool(reply.get("succeeded", False)), revision=int(reply["header"]["revision"]))

    async def put(self, key: str, value: str) -> int:
        """Unguarded put (tests, tools); returns the new revision."""
        reply = await self._gateway.post("/v3/kv/put", {"key": b64(key), "value": b64(value)})
        return int(reply["header"]["revision"])

    async def delete_prefix(self, prefix: str) -> int:
        """Unguarded delete of a prefix (tests, tools); returns the new revision."""
        reply = await self._gateway.post("/v3/kv/deleterange", {"key": b64(prefix), "range_end": b64_range_end(prefix)})
        return int(reply["header"]["revision"])

    async def delete(self, key: str) -> int:
        """Unguarded delete of one key (tests, tools); returns the new revision."""
        reply = await self._gateway.post("/v3/kv/deleterange", {"key": b64(key)})
        return int(reply["header"]["revision"])

    async def lease_grant(self, ttl: int) -> int:
        """A new lease of `ttl` seconds; returns its ID."""
        reply = await self._gateway.post("/v3/lease/grant", {"TTL": str(ttl)})
        return int(reply["ID"])

    async def lease_keepalive(self, lease: int) -> int:
        """Refresh a lease; returns its remaining TTL (0: it expired)."""
        reply = await self._gateway.post("/v3/lease/keepalive", {"ID": str(lease)})
        result = reply.get("result", reply)
        return int(result.get("TTL", 0))

    async def lease_revoke(self, lease: int) -> None:
        """Revoke a lease (its keys are deleted)."""
        await self._gateway.post("/v3/lease/revoke", {"ID": str(lease)})

    async def revision(self) -> int:
        """The current revision of the store."""
        reply = await self._gateway.post("/v3/kv/range", {"key": b64("\x00"), "keys_only": True, "limit": "1"})
        return int(reply["header"]["revision"])

    async def probe_while_idle(self, every: float) -> None:
        """Ask etcd for its revision whenever it has been quiet for `every` seconds, forever.

        Reachability must see an outage also while nothing is written (readiness reads it).
        """
        while True:
            await asyncio.sleep(every / 2)
            if self.idle_for() >= every:
                with contextlib.suppress(EtcdError):
                    await self.revision()

    async def watch_prefix(self, prefix: str, start_revision: int, idle_timeout: float) -> AsyncIterator[list[WatchEvent]]:
        """Yield batches of events under `prefix` from `start_revision` on.

        Raises WatchCanceled when etcd cancels (compaction), EtcdError when the stream breaks or
        stays silent longer than `idle_timeout` (after an etcd restart a stream can block forever).
        Progress notifications keep a healthy idle stream alive.
        """
        body = {
            "create_request": {
                "key": b64(prefix),
                "range_end": b64_range_end(prefix),
                "start_revision": str(start_revision),
                "progress_notify": True,
            }
        }
        gateway = self._gateway
        url = gateway.endpoint + "/v3/watch"
        timeout = aiohttp.ClientTimeout(total=None, sock_read=idle_timeout, connect=gateway.timeout)
        if gateway.authenticated:
            await self.revision()  # refreshes the token if it expired
        try:
            async with gateway.session().post(url, json=body, timeout=timeout, **gateway.request_kwargs()) as resp:
                if resp.status != 200:
                    raise EtcdError(error_text(await resp.read(), resp.status), status=resp.status)
                while line := await resp.content.readline(max_line_length=_MAX_WATCH_LINE):
                    gateway.answered()
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


