"""A small asyncio client of etcd's v3 gRPC-gateway JSON API, on aiohttp.

etcd3gw is synchronous with no default timeout and silent watch failures
(docs/writer.md, "Talking to etcd"), so the daemon talks to the same gateway directly: full control of
compares, `header.revision`, paging (`more`), watch resume and error codes.
"""

from __future__ import annotations

import asyncio
import base64
import re
import json
import ssl
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from ..errors import EtcdError, WatchCanceled
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


@dataclass(frozen=True)
class EtcdSecurity:
    """TLS towards etcd (CA bundle, client certificate, server name) and username/password auth."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client TLS context, or None when nothing TLS-related is configured."""
        if not (self.ca_file or self.cert_file):
            return None
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


@dataclass(frozen=True)
class Reachability:
    """Whether etcd answered the last request (None: not asked yet), the failure if not, and since when (monotonic)."""

    reachable: bool | None
    error: str | None
    since: float


class EtcdClient:
    """Range, txn and watch against one etcd gateway endpoint (the first that answers).

    Every request, watch line or failure updates `reachability()`: the evidence readiness
    uses, also when nothing is being written.
    """

    def __init__(
        self, endpoints: Sequence[str], timeout: float = 5.0, page_size: int = 5000, security: EtcdSecurity | None = None
    ) -> None:
        self._endpoints = list(endpoints)
        self._current = 0
        self._timeout = timeout
        self._page_size = page_size
        self._session: aiohttp.ClientSession | None = None
        self._security = security or EtcdSecurity()
        self._ssl = self._security.ssl_context()
        self._token: str | None = None
        self._reachability = Reachability(None, None, time.monotonic())
        self._last_answer = 0.0

    @property
    def endpoint(self) -> str:
        """The endpoint requests go to now (the next one is tried when it fails)."""
        return self._endpoints[self._current]

    def reachability(self) -> Reachability:
        """What the last request said about etcd."""
        return self._reachability

    def idle_for(self) -> float:
        """Seconds since etcd last answered anything."""
        return time.monotonic() - self._last_answer

    def _answered(self) -> None:
        self._last_answer = time.monotonic()
        if self._reachability.reachable is not True:
            self._reachability = Reachability(True, None, self._last_answer)

    def _failed(self, error: EtcdError) -> EtcdError:
        if self._reachability.reachable is not False or self._reachability.error != error.title:
            since = self._reachability.since if self._reachability.reachable is False else time.monotonic()
            self._reachability = Reachability(False, error.title, since)
        return error

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64, ssl=self._ssl if self._ssl is not None else True),
                timeout=aiohttp.ClientTimeout(total=self._timeout),
            )
        return self._session

    def _request_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self._token is not None:
            kwargs["headers"] = {"Authorization": self._token}
        if self._security.server_name:
            kwargs["server_hostname"] = self._security.server_name
        return kwargs

    async def _authenticate(self) -> None:
        # Simple and JWT tokens expire (--auth-token-ttl): a new one is fetched whenever etcd
        # rejects the current one, so an idle exporter never loses its writes.
        sec = self._security
        self._token = None
        url = self._endpoints[self._current] + "/v3/auth/authenticate"
        try:
            async with self._http().post(url, json={"name": sec.username, "password": sec.password}, **self._request_kwargs()) as resp:
                payload = await resp.read()
                if resp.status != 200:
                    raise EtcdError(
                        f"etcd authentication failed for user {sec.username!r}: {_error_text(payload, resp.status)}"
                    )
                self._token = json.loads(payload)["token"]
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise _connection_error(url, exc) from None

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _post(self, path: str, body: dict[str, Any] | bytes) -> dict[str, Any]:
        last: EtcdError | None = None
        reauthenticated = False
        attempt = 0
        while attempt < len(self._endpoints):
            url = self._endpoints[self._current] + path
            try:
                if self._security.username and self._token is None:
                    await self._authenticate()
                kwargs = self._request_kwargs()
                if isinstance(body, bytes):
                    kwargs["headers"] = {**kwargs.get("headers", {}), "Content-Type": "application/json"}
                    kwargs["data"] = body
                else:
                    kwargs["json"] = body
                async with self._http().post(url, **kwargs) as resp:
                    payload = await resp.read()
                    if resp.status != 200:
                        error = EtcdError(_error_text(payload, resp.status), status=resp.status)
                        if self._security.username and not reauthenticated and _token_rejected(resp.status, payload):
                            reauthenticated = True
                            self._token = None
                            continue
                        # 503 is gRPC's Unavailable (no leader, member stopping): as good as unreachable.
                        raise self._failed(error) if resp.status == 503 else error
                    result: dict[str, Any] = orjson.loads(payload)
                    self._answered()
                    return result
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError, OSError) as exc:
                last = _connection_error(url, exc)
                self._current = (self._current + 1) % len(self._endpoints)
                attempt += 1
        assert last is not None
        raise self._failed(last)

    async def get(self, key: str) -> KeyValue | None:
        """One key, or None."""
        reply = await self._post("/v3/kv/range", {"key": b64(key)})
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
            reply = await self._post("/v3/kv/range", body)
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
        reply = await self._post("/v3/kv/txn", txn_body(compares, ops))
        # The gateway omits `succeeded` when it is false.
        return TxnResult(succeeded=bool(reply.get("succeeded", False)), revision=int(reply["header"]["revision"]))

    async def put(self, key: str, value: str) -> int:
        """Unguarded put (tests, tools); returns the new revision."""
        reply = await self._post("/v3/kv/put", {"key": b64(key), "value": b64(value)})
        return int(reply["header"]["revision"])

    async def delete_prefix(self, prefix: str) -> int:
        """Unguarded delete of a prefix (tests, tools); returns the new revision."""
        reply = await self._post("/v3/kv/deleterange", {"key": b64(prefix), "range_end": b64_range_end(prefix)})
        return int(reply["header"]["revision"])

    async def delete(self, key: str) -> int:
        """Unguarded delete of one key (tests, tools); returns the new revision."""
        reply = await self._post("/v3/kv/deleterange", {"key": b64(key)})
        return int(reply["header"]["revision"])

    async def lease_grant(self, ttl: int) -> int:
        """A new lease of `ttl` seconds; returns its ID."""
        reply = await self._post("/v3/lease/grant", {"TTL": str(ttl)})
        return int(reply["ID"])

    async def lease_keepalive(self, lease: int) -> int:
        """Refresh a lease; returns its remaining TTL (0: it expired)."""
        reply = await self._post("/v3/lease/keepalive", {"ID": str(lease)})
        result = reply.get("result", reply)
        return int(result.get("TTL", 0))

    async def lease_revoke(self, lease: int) -> None:
        """Revoke a lease (its keys are deleted)."""
        await self._post("/v3/lease/revoke", {"ID": str(lease)})

    async def revision(self) -> int:
        """The current revision of the store."""
        reply = await self._post("/v3/kv/range", {"key": b64("\x00"), "keys_only": True, "limit": "1"})
        return int(reply["header"]["revision"])

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
        url = self._endpoints[self._current] + "/v3/watch"
        timeout = aiohttp.ClientTimeout(total=None, sock_read=idle_timeout, connect=self._timeout)
        if self._security.username:
            await self.revision()  # refreshes the token if it expired
        try:
            async with self._http().post(url, json=body, timeout=timeout, **self._request_kwargs()) as resp:
                if resp.status != 200:
                    raise EtcdError(_error_text(await resp.read(), resp.status), status=resp.status)
                while line := await resp.content.readline(max_line_length=_MAX_WATCH_LINE):
                    self._answered()
                    if events := _watch_events(line):
                        yield events
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            self._current = (self._current + 1) % len(self._endpoints)
            error = EtcdError(f"watch on {url} broke: {type(exc).__name__}", unavailable=True)
            # A stream that stayed silent past its idle timeout says nothing about etcd; a broken connection does.
            raise (error if isinstance(exc, asyncio.TimeoutError) else self._failed(error)) from None
        self._current = (self._current + 1) % len(self._endpoints)
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


def _token_rejected(status: int, payload: bytes) -> bool:
    text = payload.decode(errors="replace").lower()
    return status == 401 or "invalid auth token" in text or "token" in text and "expired" in text


def _connection_error(url: str, exc: BaseException) -> EtcdError:
    """An unreachable etcd, with the TLS cause named when there is one."""
    text = str(exc)
    if isinstance(exc, aiohttp.ClientConnectorCertificateError) or "CERTIFICATE_VERIFY_FAILED" in text:
        cause = "TLS verification of etcd's certificate failed (wrong CA bundle or server name?)"
    elif "certificate required" in text.lower() or "bad certificate" in text.lower() or "unknown ca" in text.lower():
        cause = "etcd rejected the TLS handshake (client certificate missing or not signed by etcd's CA)"
    else:
        cause = f"unreachable: {type(exc).__name__} {text}".strip()
    return EtcdError(f"etcd at {url} {cause}", unavailable=True)


def _error_text(payload: bytes, status: int) -> str:
    try:
        data = json.loads(payload)
        message = data.get("message") or data.get("error") or payload.decode(errors="replace")
    except ValueError:
        message = payload.decode(errors="replace")
    return f"etcd answered HTTP {status}: {str(message)[:300]}"
