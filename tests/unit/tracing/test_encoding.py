"""The daemon's OTLP encoder builds the message the SDK's encoder builds, field for field."""

from __future__ import annotations

import random

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
from opentelemetry.util.types import AttributeValue

from exporter.tracing import encoding
from exporter.tracing.encoding import SpanEncoder
from exporter.tracing.finished import SCOPE

RESOURCES = [Resource.create({"service.name": "a", "service.instance.id": "i"}), Resource({"service.name": "b"}, "https://schema/1")]
SCOPES = [SCOPE, InstrumentationScope("other", "1.0", "https://schema/2"), None]


def _context(rng: random.Random, remote: bool = False, state: TraceState | None = None) -> SpanContext:
    return SpanContext(rng.getrandbits(128), rng.getrandbits(64), remote, TraceFlags(1), state)


def _span(rng: random.Random, n: int) -> ReadableSpan:
    attributes: dict[str, AttributeValue] = {
        "http.route": "/v2/ingress/upsert", "http.response.status_code": rng.choice([204, 400]), "exporter.paced": n % 2 == 0,
        "exporter.ingress_names": ("w/a", "w/b"), "ratio": 0.5, "exporter.request_id": f"{n:032x}",
    }
    events = [Event("queued", None, n), Event("etcd Txn", {"exporter.revision": n, "exporter.txn.succeeded": True}, n + 1)][: n % 3]
    links = [Link(_context(rng)), Link(_context(rng, remote=True), {"why": "batch"})][: n % 3]
    status = Status(StatusCode.ERROR, "ValidationFailed") if n % 4 == 0 else Status(StatusCode.UNSET)
    parent = _context(rng, remote=n % 5 == 0) if n % 2 else None
    state = TraceState([("vendor", "x")]) if n % 7 == 0 else None
    return ReadableSpan(f"span {n % 3}", _context(rng, state=state), parent, RESOURCES[n % 2], attributes if n % 6 else None, events,
                        links, list(SpanKind)[n % 5], None, status, n, n + 10, SCOPES[n % 3])


def test_the_request_is_the_sdks_for_every_kind_of_span_the_daemon_makes() -> None:
    rng = random.Random(7)
    encoder = SpanEncoder()
    for size in (1, 7, 200):
        spans = [_span(rng, n) for n in range(size)]
        assert encoder.request(spans) == encode_spans(spans)
    # The same again, from the encoded attributes it kept.
    assert encoder.request(spans) == encode_spans(spans)


def test_the_kept_attributes_start_again_past_their_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    encoder = SpanEncoder()
    spans = [_span(rng, n) for n in range(1, 60, 2)]  # each with a request id of its own
    monkeypatch.setattr(encoding, "_KEPT", 16)
    assert encoder.request(spans) == encode_spans(spans)
    assert 0 < len(encoder._values) <= 16
