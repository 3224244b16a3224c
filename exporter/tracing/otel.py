"""Tracing with OpenTelemetry: the hooks of `tracing/hooks.py` as spans (imported only when `otel.enabled`).

A push is a SERVER span continuing the coordinator's `traceparent`, made when it ends
(`tracing/finished.py`). Its steps are events of it: `queued` when its validation is done
and its intents are queued, `batch taken` when the write loop took them, `etcd Txn` for each
transaction that carried them. The batch that wrote it is a span of its own, linked both
ways, with the plans and transactions as children (`tracing/batch.py`). Each revision
committed under a root becomes a `traefik served` span once the observer sees Traefik serve
it (`tracing/served.py`); a push that waits to be served is its parent.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit

from loguru import logger
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, SpanProcessor, TracerProvider
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from ..keys import IngressRef
from ..logs import add_patcher
from .batch import BatchRecord, Staged
from .finished import FinishedSpans
from .hooks import ClientCall, PushSpan, Tracing, TxnRecord
from .served import ServedSpans

_PROPAGATOR = TraceContextTextMapPropagator()
# Seconds between two log lines of the same SDK message.
_QUIET = 10.0
# The push whose handler is running in this task (set by `push`, read when its intents are staged).
_PUSH: ContextVar[_OtelPush | None] = ContextVar("exporter_push", default=None)
# The batch being written in this task and the tasks it starts.
_BATCH: ContextVar[BatchRecord | None] = ContextVar("exporter_batch", default=None)


class _OtelPush(PushSpan):
    """A sampled push: its context, current while it runs; the span itself is made when it ends."""

    def __init__(self, span: SpanContext, parent: SpanContext, waits: bool, attributes: dict[str, AttributeValue]) -> None:
        self.span = span
        self.parent = parent
        self.waits = waits
        self.attributes = attributes
        self.error: str | None = None
        self.arrived_ns = time.time_ns()
        # Its steps, filled in by the batches that carry it (tracing/batch.py).
        self.events: list[Event] = []
        self.links: list[Link] = []

    def queued(self) -> Staged:
        """Its intents are queued: the end of its validation, an event of its span."""
        now = time.time_ns()
        self.events.append(Event("queued", None, now))
        return Staged(self.span, self.waits, now, self.events, self.links)

    def refused(self, error_type: str) -> None:
        self.error = error_type

    def finish(self, status: int, ingresses: int) -> None:
        self.attributes["http.response.status_code"] = status
        self.attributes["exporter.ingresses"] = ingresses
        if self.error is not None or status >= 500:
            self.error = self.error or str(status)
            self.attributes["error.type"] = self.error


class _OtelCall(ClientCall):
    def __init__(self, span: trace.Span) -> None:
        super().__init__()
        self.span = span

    def answered(self, status: int) -> None:
        self.span.set_attribute("http.response.status_code", status)
        if not 200 <= status < 300:
            self.failed(str(status))

    def failed(self, error_type: str) -> None:
        self.span.set_attribute("error.type", error_type)
        self.span.set_status(Status(StatusCode.ERROR, error_type))


class OtelTracing(Tracing):
    """Every hook as OpenTelemetry spans on `provider` (its processor exports them)."""

    enabled = True

    def __init__(self, provider: TracerProvider, processor: SpanProcessor) -> None:
        """`processor`: the one `provider` exports with (finished spans go to it directly)."""
        self.provider = provider
        self._tracer = provider.get_tracer("traefik-etcd-exporter")
        self._spans = FinishedSpans(provider, processor)
        self._served = ServedSpans(self._tracer)
        self._observed = False

    def expect_served(self) -> None:
        self._observed = True

    @contextlib.contextmanager
    def push(self, method: str, route: str, headers: Mapping[str, str], request_id: str, waits: bool) -> Iterator[PushSpan]:
        parent = _PROPAGATOR.extract(headers)
        name = f"{method} {route}"
        attributes: dict[str, AttributeValue] = {"http.request.method": method, "http.route": route, "exporter.request_id": request_id}
        context = self._spans.sampled(parent, name, SpanKind.SERVER, attributes)
        if context is None:
            yield self.NO_SPAN
            return
        handle = _OtelPush(context, trace.get_current_span(parent).get_span_context(), waits, attributes)
        token = _PUSH.set(handle)
        try:
            with trace.use_span(trace.NonRecordingSpan(context), end_on_exit=False):
                yield handle
        finally:
            _PUSH.reset(token)
            # Copies: a later batch (keys held for pacing) may still add to the lists after the span is handed on.
            self._spans.span(context, handle.parent, name, handle.arrived_ns, time.time_ns(), handle.attributes, kind=SpanKind.SERVER,
                             error=handle.error, events=tuple(handle.events), links=tuple(handle.links))

    def staged(self) -> Staged | None:
        push = _PUSH.get()
        return push.queued() if push is not None else None

    @contextlib.contextmanager
    def batch(self, staged: Sequence[tuple[Any, IngressRef]], paced_roots: frozenset[str]) -> Iterator[None]:
        record = BatchRecord.of(staged, paced_roots, self._spans)
        token = _BATCH.set(record)
        try:
            yield
        finally:
            _BATCH.reset(token)
            record.emit(self._spans)

    def planned(self, started_ns: int, revision: int, refs: Sequence[IngressRef]) -> None:
        if (record := _BATCH.get()) is not None:
            record.planned(started_ns, time.time_ns(), revision, refs)

    def txn(self, record: TxnRecord) -> None:
        batch = _BATCH.get()
        if batch is not None:
            batch.answered(record)
        if record.succeeded and self._observed:
            self._served.committed(record, batch)

    def served(self, root: str, revision: int, poll_interval: float) -> None:
        self._served.served(root, revision, poll_interval)

    @contextlib.contextmanager
    def probe_changed(self, name: str, node: str, started_ns: int, attributes: Mapping[str, str]) -> Iterator[None]:
        span = self._tracer.start_span(
            "health probe", Context(), start_time=started_ns,
            attributes={"exporter.health.target": name, "exporter.health.node": node},
        )
        span.add_event("state change", dict(attributes))
        with trace.use_span(span, end_on_exit=True):
            yield

    def linked(self) -> Any:
        context = trace.get_current_span().get_span_context()
        return context if context.is_valid and context.trace_flags.sampled else None

    @contextlib.contextmanager
    def notification(self, url: str, events: int, links: Sequence[Any]) -> Iterator[ClientCall]:
        parts = urlsplit(url)
        span = self._tracer.start_span(
            "POST", Context(), kind=SpanKind.CLIENT, links=[Link(context) for context in links],
            attributes={"http.request.method": "POST", "server.address": parts.hostname or "", "server.port": parts.port or 0,
                        "exporter.notification.events": events},
        )
        call = _OtelCall(span)
        _PROPAGATOR.inject(call.headers, trace.set_span_in_context(span))
        with trace.use_span(span, end_on_exit=True, record_exception=False):
            yield call

    def shutdown(self) -> None:
        self.provider.shutdown()


def add_trace_ids(record: Any) -> None:
    """A loguru patcher: a line written inside a span carries its `trace_id` and `span_id`."""
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        record["extra"]["trace_id"] = format(context.trace_id, "032x")
        record["extra"]["span_id"] = format(context.span_id, "016x")


class _ToLoguru(logging.Handler):
    """The SDK's own messages (an export that failed, spans dropped) as the daemon's log lines; the same
    message at most once per `_QUIET` seconds (a full queue warns for every span it drops)."""

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[str, tuple[float, int]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        text, now = record.getMessage(), time.monotonic()
        last, quiet = self._last.get(text, (-_QUIET, 0))
        if now - last < _QUIET:
            self._last[text] = (last, quiet + 1)
            return
        if len(self._last) > 256:  # messages vary (a retry's delay): keep only the recent ones
            self._last = {m: seen for m, seen in self._last.items() if now - seen[0] < _QUIET}
        self._last[text] = (now, 0)
        level = record.levelname if record.levelname in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL") else "WARNING"
        logger.log(level, "tracing: {}{}", text, f" ({quiet} more like it in {_QUIET:.0f}s)" if quiet else "")


def join_logs() -> None:
    """Every log line written inside a span names it (the JSON lines' `trace_id`, `span_id`), and the SDK
    logs through the daemon's logger."""
    add_patcher(add_trace_ids)
    sdk = logging.getLogger("opentelemetry")
    if not any(isinstance(h, _ToLoguru) for h in sdk.handlers):
        sdk.addHandler(_ToLoguru())
    sdk.propagate = False
