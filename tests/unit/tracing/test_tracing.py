"""Tracing's pure parts: the settings it reads, the spans a batch and a served commit make (the SDK's in-memory exporter)."""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from exporter.config.sections import OtelSettings
from exporter.errors import ConfigError
from exporter.keys import IngressRef
from exporter.tracing import batch as batch_module
from exporter.tracing import served as served_module
from exporter.tracing.hooks import NO_TRACING, TxnRecord
from exporter.tracing.otel import OtelTracing
from exporter.tracing.setup import endpoint_of, read_headers
from tests.helpers import REPO

A, B = IngressRef("w", "a"), IngressRef("w", "b")
ROOT = "traefik/worker_w"


@pytest.fixture
def spans() -> Iterator[tuple[OtelTracing, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    processor = SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    tracing = OtelTracing(provider, processor)
    tracing.expect_served()
    yield tracing, exporter
    provider.shutdown()


def _txn(revision: int, *refs: IngressRef, keys: bool = True, ok: bool = True) -> TxnRecord:
    return TxnRecord(1_000, 2_000, ok, revision, 5, refs, {ROOT: refs} if keys else {})


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _push(tracing: OtelTracing, waits: bool = False) -> object:
    with tracing.push("POST", "/v2/ingress/upsert", {}, "req", waits):
        return tracing.staged()


@contextlib.contextmanager
def _open_push(tracing: OtelTracing) -> Iterator[object]:
    """A push whose intents are queued, open until the block ends (as a handler waits for its batch)."""
    with tracing.push("POST", "/v2/ingress/upsert", {}, "req", False):
        yield tracing.staged()


def test_a_batch_is_one_span_linked_both_ways_to_its_pushes_whose_spans_carry_its_steps_as_events(
    spans: tuple[OtelTracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = spans
    with contextlib.ExitStack() as open_pushes:
        one, two = (open_pushes.enter_context(_open_push(tracing)) for _ in range(2))
        with tracing.batch([(one, A), (two, B), (None, IngressRef("w", "untraced"))], frozenset()):
            tracing.planned(10, 7, [A, B])
            tracing.txn(_txn(8, A))
            tracing.txn(_txn(9, B, ok=False))
            tracing.txn(_txn(10, IngressRef("w", "untraced")))  # carries no traced push: not in the batch's trace
        assert not _named(exporter, "POST /v2/ingress/upsert")  # a push's span is made at its end
    pushes = {s.context.span_id: s for s in _named(exporter, "POST /v2/ingress/upsert")}
    (batch,) = _named(exporter, "write batch")
    assert len(pushes) == 2 and batch.parent is None and batch.context.trace_id not in {s.context.trace_id for s in pushes.values()}
    assert {link.context.span_id for link in batch.links} == set(pushes)
    assert batch.attributes == {"exporter.pushes": 2, "exporter.ingresses": 2}
    for push in pushes.values():
        assert [link.context.span_id for link in push.links] == [batch.context.span_id]
    for name, count in (("plan", 1), ("etcd Txn", 2)):
        made = _named(exporter, name)
        assert len(made) == count and all(s.parent is not None and s.parent.span_id == batch.context.span_id for s in made), name
    txns = {s.attributes["exporter.revision"]: s for s in _named(exporter, "etcd Txn") if s.attributes}
    assert txns[8].attributes == {"db.system.name": "etcd", "db.operation.name": "Txn", "exporter.revision": 8,
                                  "exporter.txn.operations": 5, "exporter.txn.succeeded": True, "exporter.ingresses": 1}
    assert txns[9].attributes is not None and txns[9].attributes["exporter.txn.succeeded"] is False
    assert (txns[8].start_time, txns[8].end_time) == (1_000, 2_000) and 10 not in txns
    # Each push's own steps: queued, taken by the batch, the transaction that carried it.
    (carried_a,) = (s for s in pushes.values() if s.events[-1].attributes == {"exporter.revision": 8, "exporter.txn.succeeded": True})
    assert [e.name for e in carried_a.events] == ["queued", "batch taken", "etcd Txn"]
    assert carried_a.events[1].timestamp == batch.start_time and carried_a.events[2].timestamp == 2_000
    assert carried_a.events[0].timestamp <= batch.start_time


def test_a_commit_is_served_once_traefik_shows_its_revision_or_a_later_one(spans: tuple[OtelTracing, InMemorySpanExporter]) -> None:
    tracing, exporter = spans
    push = _push(tracing)
    with tracing.batch([(push, A)], frozenset({ROOT})):
        tracing.txn(_txn(5, A))
        tracing.txn(_txn(6, A))
    tracing.txn(_txn(7))  # a commit no push asked for (a repair)
    tracing.served(ROOT, 5, 0.05)
    assert [s.attributes["exporter.revision"] for s in _named(exporter, "traefik served") if s.attributes] == [5]
    tracing.served(ROOT, 7, 0.05)
    served = _named(exporter, "traefik served")
    assert [s.attributes["exporter.revision"] for s in served if s.attributes] == [5, 6, 7]
    pushed = next(s for s in exporter.get_finished_spans() if s.name.startswith("POST"))
    assert [link.context.span_id for link in served[0].links] == [pushed.context.span_id]
    assert served[0].parent is None and served[0].attributes is not None
    assert served[0].attributes["exporter.paced"] is True and served[0].attributes["exporter.ingress_names"] == ("w/a",)
    assert served[0].attributes["exporter.observer.poll_interval_s"] == 0.05 and served[0].start_time == 2_000
    assert served[2].links == () and served[2].attributes is not None and served[2].attributes["exporter.paced"] is False
    # Served already: a commit Traefik is known to serve ends at once.
    tracing.txn(_txn(4, A))
    assert len(_named(exporter, "traefik served")) == 4


def test_a_waiting_push_is_the_parent_and_held_keys_carry_their_push_to_the_later_commit(
    spans: tuple[OtelTracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = spans
    waiting = _push(tracing, waits=True)
    with tracing.batch([(waiting, A)], frozenset()):
        tracing.txn(_txn(3, A, keys=False))  # its record alone: its keys are held (write/pacer.py)
    tracing.txn(_txn(4, A))  # the pacer writes them in a later batch
    tracing.served(ROOT, 4, 0.01)
    (served,) = _named(exporter, "traefik served")
    pushed = next(s for s in exporter.get_finished_spans() if s.name.startswith("POST"))
    assert served.parent is not None and served.parent.span_id == pushed.context.span_id
    assert served.attributes is not None and served.attributes["exporter.revision"] == 4


def test_without_an_observer_no_commit_waits_and_the_pending_are_bounded(
    spans: tuple[OtelTracing, InMemorySpanExporter], monkeypatch: pytest.MonkeyPatch,
) -> None:
    unobserved = OtelTracing(spans[0].provider, SimpleSpanProcessor(InMemorySpanExporter()))
    unobserved.txn(_txn(5, A))
    assert unobserved._served._pending == {}
    tracing, exporter = spans
    monkeypatch.setattr(served_module, "MAX_PENDING", 3)
    bounded = served_module.ServedSpans(tracing.provider.get_tracer("t"))
    for revision in range(1, 11):
        bounded.committed(_txn(revision, A), None)
    bounded.served(ROOT, 100, 1.0)
    assert [s.attributes["exporter.revision"] for s in _named(exporter, "traefik served") if s.attributes] == [8, 9, 10]


def test_a_refused_push_is_one_span_with_the_error_type_and_a_queued_one_says_when(
    spans: tuple[OtelTracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = spans
    with tracing.push("POST", "/v2/ingress/remove", {"traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"}, "r", False) as push:
        push.refused("ValidationFailed")
        push.finish(400, 0)
    (server,) = exporter.get_finished_spans()
    assert server.status.description == "ValidationFailed" and server.attributes is not None and server.events == ()
    assert server.attributes["error.type"] == "ValidationFailed" and server.attributes["http.response.status_code"] == 400
    assert server.parent is not None and server.parent.span_id == int("cd" * 8, 16) and server.context.trace_id == int("ab" * 16, 16)
    exporter.clear()
    staged = _push(tracing)
    (server,) = exporter.get_finished_spans()
    assert [(e.name, e.timestamp) for e in server.events] == [("queued", getattr(staged, "at_ns", None))] and server.status.is_ok


def test_the_disabled_hooks_record_nothing() -> None:
    assert not NO_TRACING.enabled and NO_TRACING.staged() is None and NO_TRACING.linked() is None
    with NO_TRACING.notification("http://x", 1, []) as call:
        assert call.headers == {}


def test_headers_file_lines_and_commas_and_errors_never_show_a_value(tmp_path: Path) -> None:
    path = tmp_path / "headers"
    path.write_text("Authorization=Bearer s3cret\n# a comment\nx-scope: team-a, x-other=1\n")
    assert read_headers(path) == {"authorization": "Bearer s3cret", "x-scope": "team-a", "x-other": "1"}
    path.write_text("just-a-s3cret-value\n")
    with pytest.raises(ConfigError, match="line 1") as info:
        read_headers(path)
    assert "s3cret" not in info.value.title
    with pytest.raises(ConfigError, match="cannot read"):
        read_headers(tmp_path / "missing")


def test_the_endpoint_follows_the_standard_variable_only_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    assert endpoint_of(OtelSettings()) == "http://collector:4317"
    assert endpoint_of(OtelSettings(endpoint="http://mine:4317")) == "http://mine:4317"
    assert endpoint_of(OtelSettings(endpoint="http://mine:4318", protocol="http/protobuf")) == "http://mine:4318/v1/traces"
    assert endpoint_of(OtelSettings(endpoint="http://mine:4318/v1/traces", protocol="http/protobuf")) == "http://mine:4318/v1/traces"
    with pytest.raises(ValueError, match="max_export_batch_size"):
        OtelSettings(max_queue_size=10, max_export_batch_size=11)
    with pytest.raises(ValueError, match="endpoint"):
        OtelSettings(endpoint="collector:4317")


def test_only_the_tracing_package_imports_opentelemetry_and_its_setup_only_when_enabled() -> None:
    importers = set()
    for path in sorted((REPO / "exporter").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(
                node, ast.ImportFrom) else []
            if any(n.startswith("opentelemetry") for n in names):
                importers.add(str(path.relative_to(REPO)))
    assert importers == {f"exporter/tracing/{name}.py" for name in ("otel", "batch", "served", "finished", "setup", "encoding")}


def test_the_sdk_logs_through_the_daemons_logger_once_per_ten_seconds_per_message() -> None:
    import logging

    from loguru import logger

    from exporter.tracing.otel import join_logs

    join_logs()
    lines: list[str] = []
    sink = logger.add(lines.append, format="{message}")
    try:
        for _ in range(5):
            logging.getLogger("opentelemetry.sdk._shared_internal").warning("Queue full, dropping %s.", "Span")
    finally:
        logger.remove(sink)
    assert [line.strip() for line in lines] == ["tracing: Queue full, dropping Span."]


def test_commits_answered_out_of_order_are_served_in_revision_order(spans: tuple[OtelTracing, InMemorySpanExporter]) -> None:
    tracing, exporter = spans
    for revision in (5, 7, 6):
        tracing.txn(_txn(revision, A))
    tracing.served(ROOT, 6, 0.05)
    assert [s.attributes["exporter.revision"] for s in _named(exporter, "traefik served") if s.attributes] == [5, 6]


def test_a_batch_links_to_at_most_max_links_of_its_pushes_and_every_push_to_it(
    spans: tuple[OtelTracing, InMemorySpanExporter], monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracing, exporter = spans
    monkeypatch.setattr(batch_module, "MAX_LINKS", 3)
    with contextlib.ExitStack() as open_pushes:
        staged = [(open_pushes.enter_context(_open_push(tracing)), IngressRef("w", f"i{n}")) for n in range(5)]
        with tracing.batch(staged, frozenset()):
            pass
    (batch,) = _named(exporter, "write batch")
    assert len(batch.links) == 3 and batch.attributes is not None and batch.attributes["exporter.pushes"] == 5
    assert all(s.links[0].context == batch.context for s in _named(exporter, "POST /v2/ingress/upsert"))
