"""etcd's reads, transactions and leases over its v3 JSON gateway (`Gateway`), on aiohttp.

The transport before gRPC, kept as the `etcd.transport: gateway` option: compares, `header.revision`,
paging (`more`) and error codes exactly as the gateway exposes them. Request bodies are built as
text (base64 needs no escaping).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from .gateway import Gateway
from .types import Compare, KeyValue, Op, RangePage, TxnResult, b64, b64_range_end, kv_of, txn_body


class GatewayKv:
    """Range, txn, put, delete and leases on etcd's JSON gateway."""

    def __init__(self, gateway: Gateway, page_size: int) -> None:
        self._gateway = gateway
        self._page_size = page_size

    async def get(self, key: str) -> KeyValue | None:
        """One key, or None."""
        reply = await self._gateway.post("/v3/kv/range", {"key": b64(key)})
        kvs = reply.get("kvs") or []
        return kv_of(kvs[0]) if kvs else None

    async def get_at(self, key: str, revision: int = 0) -> tuple[KeyValue | None, int]:
        """One key (or None) as it was at `revision` (the current one when 0), and the revision read."""
        body = {"key": b64(key), "revision": str(revision)} if revision else {"key": b64(key)}
        reply = await self._gateway.post("/v3/kv/range", body)
        kvs = reply.get("kvs") or []
        return (kv_of(kvs[0]) if kvs else None), revision or int(reply["header"]["revision"])

    async def range_prefix(self, prefix: str, *, revision: int = 0) -> RangePage:
        """Every key under `prefix`, read in pages pinned to one revision (never one unbounded read)."""
        page = RangePage(revision=revision)
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
