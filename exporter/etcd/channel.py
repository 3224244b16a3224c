"""The gRPC side of etcd: endpoints and failover, TLS, auth tokens, deadlines, what errors mean.

`GrpcKv` speaks etcd's operations over it; this module knows only how to reach an endpoint
(one `grpc.aio` channel each), stay authenticated, and turn gRPC's status into `EtcdError`s
shaped like the gateway's, so callers cannot tell the transports apart.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import grpc
import grpc.aio

from ..errors import EtcdError
from .gateway import EtcdSecurity
from .proto import rpc_pb2
from .reach import Evidence

Reply = TypeVar("Reply")

# What grpc-gateway answers for each gRPC status: the same numbers the gateway transport reports.
_HTTP_STATUS = {
    grpc.StatusCode.CANCELLED: 499, grpc.StatusCode.UNKNOWN: 500, grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504, grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.UNAUTHENTICATED: 401, grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400, grpc.StatusCode.ABORTED: 409, grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501, grpc.StatusCode.INTERNAL: 500, grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
}
_OPTIONS: list[tuple[str, str | int]] = [
    # Without a bound on what etcd sends back, a range page of large values would fail at 4 MiB.
    ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1),
    # gRPC's reconnect backoff grows to 120 s by default: an etcd back after a long outage would
    # wait that long for the exporter. Capped at 2 s, writes resume within ~2 s of its return.
    ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 2000),
    # A dead connection under an idle watch is found by pings (etcd's --grpc-keepalive-min-time is 5 s).
    ("grpc.keepalive_time_ms", 30_000), ("grpc.keepalive_timeout_ms", 10_000),
]


class Channels:
    """Calls to the first endpoint that answers, with a token when etcd wants one.

    `unsafe=True` marks a call that may commit (a txn, a put): it goes to another endpoint only
    when gRPC says the request never left (no connection), never after a deadline, so a
    transaction is not sent twice.
    """

    def __init__(self, endpoints: Sequence[str], timeout: float, security: EtcdSecurity, evidence: Evidence) -> None:
        self._targets = [_target(e) for e in endpoints]
        self._endpoints = list(endpoints)
        self._current = 0
        self.timeout = timeout
        self._security = security
        self._evidence = evidence
        self._credentials = _credentials(security) if any(e.startswith("https://") for e in endpoints) else None
        self._channels: dict[int, grpc.aio.Channel] = {}
        self._token: str | None = None
        self.tokens_issued = 0

    @property
    def authenticated(self) -> bool:
        """True when calls carry a token for a username."""
        return bool(self._security.username)

    @property
    def endpoint(self) -> str:
        """The endpoint calls go to now."""
        return self._endpoints[self._current]

    def _channel(self) -> grpc.aio.Channel:
        index = self._current
        if index not in self._channels:
            options = list(_OPTIONS)
            if self._security.server_name:
                options.append(("grpc.ssl_target_name_override", self._security.server_name))
            target = self._targets[index]
            secure = self._endpoints[index].startswith("https://")
            self._channels[index] = (
                grpc.aio.secure_channel(target, self._credentials, options)  # type: ignore[arg-type]
                if secure else grpc.aio.insecure_channel(target, options)
            )
        return self._channels[index]

    async def close(self) -> None:
        """Close every channel."""
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    async def call_streamed(self, method: str, request: Any, decode: Callable[[bytes], Reply]) -> Reply:
        """The first reply of a bidirectional stream sent only `request` (a lease keep-alive)."""
        return await self.call(method, request, decode, streamed=True)

    async def _invoke(
        self, method: str, request: Any, decode: Callable[[bytes], Reply], streamed: bool, serialize: Callable[[Any], bytes],
    ) -> Reply:
        channel, metadata = self._channel(), self._metadata()
        if not streamed:
            stub = channel.unary_unary(method, request_serializer=serialize, response_deserializer=decode)
            reply: Reply = await stub(request, timeout=self.timeout, metadata=metadata)
            return reply
        stream = channel.stream_stream(method, request_serializer=serialize, response_deserializer=decode)
        call = stream(iter([request]), timeout=self.timeout, metadata=metadata)
        try:
            async for first in call:
                return first
        finally:
            call.cancel()
        raise EtcdError(f"etcd at {self.endpoint} ended {method} without an answer", unavailable=True)

    async def call(
        self, method: str, request: Any, decode: Callable[[bytes], Reply], *, unsafe: bool = False,
        serialize: Callable[[Any], bytes] | None = None, streamed: bool = False,
    ) -> Reply:
        """`method` (like `/etcdserverpb.KV/Range`) with `request`; the reply decoded by `decode`."""
        last: EtcdError | None = None
        reauthenticated = False
        attempt = 0
        while attempt < len(self._endpoints):
            try:
                if self._security.username and self._token is None:
                    await self._authenticate()
                reply = await self._invoke(method, request, decode, streamed, serialize or _serialize)
                self._evidence.answered()
                return reply
            except grpc.aio.AioRpcError as exc:
                code, details = exc.code(), exc.details() or ""
                if code == grpc.StatusCode.UNAUTHENTICATED and self._security.username and not reauthenticated:
                    reauthenticated, self._token = True, None  # expired or etcd restarted: a new token, once
                    continue
                if not _connection_failure(code, details):
                    error = _answered(code, details)
                    if code == grpc.StatusCode.UNAVAILABLE:
                        raise self._evidence.failed(error) from None  # no leader, or a member stopping
                    self._evidence.answered()
                    raise error from None
                last = _unreachable(self.endpoint, details)
                if unsafe and not _never_sent(code, details):
                    raise self._evidence.failed(last) from None
                self._current = (self._current + 1) % len(self._endpoints)
                attempt += 1
        assert last is not None
        raise self._evidence.failed(last)

    async def stream(self, method: str, request: Any, decode: Callable[[bytes], Reply], idle_timeout: float) -> AsyncIterator[Reply]:
        """The replies of a long-lived bidirectional stream opened with `request` (a watch).

        Raises EtcdError when the stream breaks (the next endpoint is tried next time) or stays
        silent longer than `idle_timeout` (after an etcd restart a stream can block forever).
        """
        if self._security.username and self._token is None:
            await self._authenticate()
        endpoint = self.endpoint
        call = self._channel().stream_stream(method, request_serializer=_serialize, response_deserializer=decode)(
            metadata=self._metadata(),
        )
        read: asyncio.Future[Any] | None = None
        try:
            await call.write(request)
            while True:
                # Not wait_for: cancelling a read in flight waits for a message that may never come
                # (an idle watch, while its consumer pauses it); cancelling the call below ends it.
                read = asyncio.ensure_future(call.read())
                if not (await asyncio.wait((read,), timeout=idle_timeout))[0]:
                    # Silence past the idle timeout says nothing about etcd; a broken stream does.
                    raise EtcdError(f"{method} on {endpoint} stayed silent for {idle_timeout:g}s", unavailable=True)
                reply, read = read.result(), None
                if reply is grpc.aio.EOF:
                    raise self._evidence.failed(EtcdError(f"{method} on {endpoint} ended", unavailable=True))
                yield cast(Reply, reply)  # what `decode` made of it
        except grpc.aio.AioRpcError as exc:
            code, details = exc.code(), exc.details() or ""
            if code == grpc.StatusCode.UNAUTHENTICATED:
                self._token = None  # the next stream authenticates again
            if not _connection_failure(code, details):
                raise _answered(code, details) from None
            self._current = (self._current + 1) % len(self._endpoints)
            raise self._evidence.failed(_unreachable(endpoint, details)) from None
        finally:
            call.cancel()
            if read is not None:
                read.add_done_callback(_consumed)

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return (("token", self._token),) if self._token is not None else ()

    async def _authenticate(self) -> None:
        # Simple and JWT tokens expire (--auth-token-ttl) and die with an etcd restart: a new one
        # is fetched whenever etcd rejects the current one, so an idle exporter never loses its writes.
        sec = self._security
        request = rpc_pb2.AuthenticateRequest(name=sec.username or "", password=sec.password or "")
        stub = self._channel().unary_unary(
            "/etcdserverpb.Auth/Authenticate", request_serializer=_serialize,
            response_deserializer=rpc_pb2.AuthenticateResponse.FromString,
        )
        try:
            reply = await stub(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            code, details = exc.code(), exc.details() or ""
            if _connection_failure(code, details):
                raise _unreachable(self.endpoint, details) from None
            raise EtcdError(f"etcd authentication failed for user {sec.username!r}: {details}") from None
        self._token = reply.token
        self.tokens_issued += 1


def _consumed(read: asyncio.Future[Any]) -> None:
    """Take the outcome of a read the stream's consumer no longer waits for (the call was cancelled)."""
    if not read.cancelled():
        read.exception()


def _serialize(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data


def _target(endpoint: str) -> str:
    """`host:port` of an `http(s)://host:port` endpoint."""
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    return f"{parts.hostname}:{parts.port or 2379}"


def _credentials(security: EtcdSecurity) -> grpc.ChannelCredentials:
    def read(path: str | None) -> bytes | None:
        return Path(path).read_bytes() if path else None

    return grpc.ssl_channel_credentials(
        root_certificates=read(security.ca_file), private_key=read(security.key_file),
        certificate_chain=read(security.cert_file),
    )


def _connection_failure(code: grpc.StatusCode, details: str) -> bool:
    """The call did not reach an etcd that answered: no connection, a broken one, or no answer in time.

    etcd's own refusals (`etcdserver: no leader`, stopping) are answers, said with UNAVAILABLE too.
    """
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return True
    return code == grpc.StatusCode.UNAVAILABLE and not details.startswith("etcdserver:")


def _never_sent(code: grpc.StatusCode, details: str) -> bool:
    """gRPC failed before the request could leave: no connection was ever made for it."""
    text = details.lower()
    return code == grpc.StatusCode.UNAVAILABLE and ("failed to connect" in text or "connection refused" in text)


def _answered(code: grpc.StatusCode, details: str) -> EtcdError:
    """etcd's own refusal, with the HTTP status grpc-gateway gives it (the gateway transport's words)."""
    status = _HTTP_STATUS.get(code, 500)
    return EtcdError(f"etcd answered HTTP {status}: {details}"[:400], status=status)


def _unreachable(endpoint: str, details: str) -> EtcdError:
    """An unreachable etcd, with the TLS cause named when there is one."""
    text = details.lower()
    if "certificate_verify_failed" in text or "certificate verify failed" in text:
        cause = "TLS verification of etcd's certificate failed (wrong CA bundle or server name?)"
    elif any(sign in text for sign in ("certificate required", "bad certificate", "unknown ca", "handshake", "unwrap failed")):
        # etcd 3.4 (TLS 1.3) refuses a missing client certificate after the handshake: gRPC sees the
        # alert as a record it cannot decrypt ("Unwrap failed (TSI_DATA_CORRUPTED)").
        cause = "etcd rejected the TLS handshake (client certificate missing or not signed by etcd's CA)"
    else:
        cause = f"unreachable: {details}".strip()
    return EtcdError(f"etcd at {endpoint} {cause}"[:400], unavailable=True)
