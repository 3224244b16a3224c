"""OTLP/gRPC export requests of finished spans, built with fewer Python steps than the SDK's encoder.

The SDK's encoder converts every attribute of every span anew (a chain of type checks and two
messages per value) and hashes each span's resource to group them (a JSON dump per span). A
push's attributes repeat from one push to the next (the method, the route, the status, the
counts), so their encoded `KeyValue`s are kept and copied by the protobuf runtime; the
resource and the scope are encoded once per object. The message is the one the SDK builds,
field for field (tests/unit/tracing/test_encoding.py). Over http/protobuf the SDK's exporter
encodes with its own, having no place to hand it another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common._internal import (
    _encode_instrumentation_scope,
    _encode_key_value,
    _encode_resource,
    _encode_span_id,
    _encode_trace_id,
)
from opentelemetry.exporter.otlp.proto.common._internal.trace_encoder import (
    _SPAN_KIND_MAP,
    _encode_links,
    _encode_parent_id,
    _encode_status,
    _encode_trace_state,
    _span_flags,
)
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.sdk.trace import ReadableSpan

# Encoded attributes kept; past this many the cache starts again (request ids never repeat).
_KEPT = 4096


class SpanEncoder:
    """Builds `ExportTraceServiceRequest`s; one per exporter (its export thread is its only caller)."""

    def __init__(self) -> None:
        self._values: dict[tuple[str, type, Any], KeyValue] = {}
        self._resources: dict[int, tuple[Any, Any]] = {}  # id -> (the object, kept alive; its encoding)
        self._scopes: dict[int, tuple[Any, Any]] = {}

    def request(self, spans: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
        """The request carrying `spans`, grouped by resource and scope as the SDK groups them."""
        groups: dict[int, dict[int, list[PbSpan]]] = {}
        for span in spans:
            resource, scope = self._resource(span.resource), self._scope(span.instrumentation_scope)
            groups.setdefault(resource, {}).setdefault(scope, []).append(self._span(span))
        resource_spans = []
        for resource, scopes in groups.items():
            sdk_resource, encoded = self._resources[resource]
            scope_spans = []
            for scope, pb_spans in scopes.items():
                sdk_scope, encoded_scope = self._scopes[scope]
                schema = sdk_scope.schema_url if sdk_scope else None
                fields: dict[str, Any] = {"scope": encoded_scope, "spans": pb_spans, "schema_url": schema}
                scope_spans.append(ScopeSpans(**fields))
            resource_spans.append(ResourceSpans(resource=encoded, scope_spans=scope_spans, schema_url=sdk_resource.schema_url))
        return ExportTraceServiceRequest(resource_spans=resource_spans)

    def _resource(self, resource: Any) -> int:
        if id(resource) not in self._resources:
            self._resources[id(resource)] = (resource, _encode_resource(resource))
        return id(resource)

    def _scope(self, scope: Any) -> int:
        scope = scope or None
        if id(scope) not in self._scopes:
            self._scopes[id(scope)] = (scope, _encode_instrumentation_scope(scope))
        return id(scope)

    def _attributes(self, attributes: Mapping[str, Any] | None) -> list[KeyValue]:
        if not attributes:
            return []
        out = []
        for key, value in attributes.items():
            kind = type(value)
            if kind not in (str, int, bool, float):  # sequences: encoded each time, as the SDK does
                out.append(_encode_key_value(key, value))
                continue
            cached = self._values.get((key, kind, value))
            if cached is None:
                if len(self._values) >= _KEPT:
                    self._values.clear()
                cached = self._values[(key, kind, value)] = _encode_key_value(key, value)
            out.append(cached)
        return out

    def _span(self, span: ReadableSpan) -> PbSpan:
        context = span.context
        # The SDK's own steps, but for the attributes (kept when they repeat). Fields it leaves None
        # stay unset, as in its encoder (the stubs would have a value: hence the dict).
        fields: dict[str, Any] = {
            "trace_id": _encode_trace_id(context.trace_id), "span_id": _encode_span_id(context.span_id),
            "trace_state": _encode_trace_state(context.trace_state), "parent_span_id": _encode_parent_id(span.parent),
            "name": span.name, "kind": _SPAN_KIND_MAP[span.kind], "start_time_unix_nano": span.start_time,
            "end_time_unix_nano": span.end_time, "attributes": self._attributes(span.attributes),
            "events": [PbSpan.Event(name=e.name, time_unix_nano=e.timestamp, attributes=self._attributes(e.attributes),
                                    dropped_attributes_count=e.dropped_attributes) for e in span.events] or None,
            "links": _encode_links(span.links), "status": _encode_status(span.status),
            "dropped_attributes_count": span.dropped_attributes, "dropped_events_count": span.dropped_events,
            "dropped_links_count": span.dropped_links, "flags": _span_flags(span.parent),
        }
        return PbSpan(**fields)


class GrpcSpanExporter(OTLPSpanExporter):
    """The SDK's OTLP/gRPC exporter (retries, timeouts, compression, headers), its requests built by `SpanEncoder`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._encoder = SpanEncoder()

    def _translate_data(self, data: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
        return self._encoder.request(data)
