"""Loopback OTLP receivers, one per protocol, decoding the real `ExportTraceServiceRequest` messages.

gRPC: a `grpc.aio` server implementing the published `TraceService`; HTTP: an aiohttp server
answering `POST /v1/traces` with protobuf. Both keep every span they were sent, flattened with
its resource's attributes, for tests (and bench/) to look at.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from exporter.embedded import free_port


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as a collector receives it (ids in hex; times in ns since the epoch)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int
    status_message: str
    links: list[tuple[str, str]]
    events: list[tuple[str, dict[str, Any], int]]  # name, attributes, time (ns since the epoch)
    resource: dict[str, Any]

    @property
    def error(self) -> bool:
        """The span ended with an error status (STATUS_CODE_ERROR)."""
        return self.status_code == 2


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


def decode(request: trace_service_pb2.ExportTraceServiceRequest) -> list[ReceivedSpan]:
    """Every span of one export request."""
    out = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope in resource_spans.scope_spans:
            for span in scope.spans:
                out.append(ReceivedSpan(
                    trace_id=span.trace_id.hex(), span_id=span.span_id.hex(), parent_span_id=span.parent_span_id.hex(),
                    name=span.name, kind=span.kind, start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
                    attributes=_attributes(span.attributes), status_code=span.status.code, status_message=span.status.message,
                    links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                    events=[(event.name, _attributes(event.attributes), event.time_unix_nano) for event in span.events], resource=resource,
                ))
    return out


@dataclass
class Receiver:
    """What one receiver was sent: spans, and the metadata (gRPC) or headers (HTTP) of each export."""

    endpoint: str
    protocol: str
    spans: list[ReceivedSpan] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    exports: int = 0

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest, headers: dict[str, str]) -> None:
        """Keep the spans of one export."""
        self.spans.extend(decode(request))
        self.headers.append(headers)
        self.exports += 1

    def of_trace(self, trace_id: str) -> list[ReceivedSpan]:
        """The spans of one trace."""
        return [s for s in self.spans if s.trace_id == trace_id]

    def where(self, test: Callable[[ReceivedSpan], bool]) -> list[ReceivedSpan]:
        """The spans `test` accepts."""
        return [s for s in self.spans if test(s)]


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: Receiver) -> None:
        self._receiver = receiver

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self._receiver.add(request, {k: str(v) for k, v in context.invocation_metadata() or ()})
        return trace_service_pb2.ExportTraceServiceResponse()


@asynccontextmanager
async def grpc_receiver() -> AsyncIterator[Receiver]:
    """An OTLP/gRPC receiver on a free loopback port (`endpoint` is http://127.0.0.1:PORT)."""
    port = free_port()
    receiver = Receiver(f"http://127.0.0.1:{port}", "grpc")
    server = grpc.aio.server()
    # The generated gRPC module has no annotations.
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(receiver), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        yield receiver
    finally:
        await server.stop(None)


@asynccontextmanager
async def http_receiver() -> AsyncIterator[Receiver]:
    """An OTLP/HTTP (protobuf) receiver on a free loopback port (`endpoint` is its base URL)."""
    port = free_port()
    receiver = Receiver(f"http://127.0.0.1:{port}", "http/protobuf")

    async def export(request: web.Request) -> web.Response:
        if request.content_type != "application/x-protobuf":
            return web.Response(status=415)
        message = trace_service_pb2.ExportTraceServiceRequest.FromString(await request.read())
        receiver.add(message, {k.lower(): v for k, v in request.headers.items()})
        return web.Response(body=trace_service_pb2.ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", export)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield receiver
    finally:
        await runner.cleanup()


def receiver_for(protocol: str) -> Any:
    """The receiver context manager of one protocol."""
    return grpc_receiver() if protocol == "grpc" else http_receiver()

