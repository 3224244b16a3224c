"""Traces of a push to the moment Traefik serves it, received by a real OTLP receiver (gRPC and HTTP).

The daemon runs with the real etcd and Traefik; the receivers decode the real
`ExportTraceServiceRequest` messages the OpenTelemetry SDK sends.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from loguru import logger

from exporter.daemon import Daemon
from exporter.embedded import EmbeddedEtcd, EmbeddedTraefik, free_port
from exporter.etcd.client import EtcdClient
from exporter.keys import IngressRef
from tests.conftest import API_TOKEN, settings_for
from tests.helpers import AUTHORITY, Backend, eventually, serve_all_paths, start_daemon, stop_daemon, traefik_object, uid
from tests.otlp_receiver import ReceivedSpan, Receiver, receiver_for

pytestmark = pytest.mark.integration
SERVER, CLIENT = 2, 3  # the OTLP span kinds


@pytest.fixture(scope="module")
def quick_export() -> Iterator[None]:
    """Spans are exported every 100 ms (the SDK's standard variable; its default is 5 s)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        yield


class Traced:
    """A daemon exporting every span to `receiver`."""

    def __init__(self, daemon: Daemon, receiver: Receiver, http: aiohttp.ClientSession) -> None:
        self.daemon, self.receiver, self.http = daemon, receiver, http
        self.api = f"http://{daemon.settings.api.listen}"

    async def push(self, path: str, body: Any, headers: dict[str, str], wait: bool = False) -> int:
        query = "?wait=served" if wait else ""
        async with self.http.post(f"{self.api}/v2/ingress/{path}{query}", json=body,
                                  headers={"Authorization": f"Bearer {API_TOKEN}", **headers}) as resp:
            await resp.read()
            return resp.status

    async def spans_of(self, trace_id: str, *names: str) -> list[ReceivedSpan]:
        """Once the receiver holds a span of each of `names` in the trace: the trace's spans."""
        async def arrived() -> list[ReceivedSpan] | None:
            spans = self.receiver.of_trace(trace_id)
            return spans if set(names) <= {s.name for s in spans} else None

        return await eventually(arrived, timeout=20)


@pytest.fixture(scope="module", params=["grpc", "http/protobuf"])
async def traced(
    request: pytest.FixtureRequest, quick_export: None, etcd: EmbeddedEtcd, traefik: EmbeddedTraefik, http: aiohttp.ClientSession,
) -> AsyncIterator[Traced]:
    async with receiver_for(request.param) as receiver:
        settings = settings_for(
            etcd.url, records_prefix=f"{uid('otel')}/records",
            api={"listen": f"127.0.0.1:{free_port()}", "token": API_TOKEN, "served_timeout": 20},
            control={"listen": f"127.0.0.1:{free_port()}"},
            traefik={"api_url": traefik.api, "poll_interval": 0.2},
            otel={"enabled": True, "endpoint": receiver.endpoint, "protocol": request.param, "service_name": "exporter-under-test"},
        )
        daemon = Daemon(settings)
        await daemon.start()
        await daemon.parts.reconciler.wait_synced(30)
        yield Traced(daemon, receiver, http)
        await daemon.stop()


def _traceparent() -> tuple[str, str, str]:
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, parent, f"00-{trace_id}-{parent}-01"


def _body(iid: str, url: str) -> dict[str, Any]:
    return {"ingresses": [{"authority": AUTHORITY, "id": iid, "revision": 1, "hosts": [f"{iid}.test"],
                           "upstream": {"servers": [{"url": url}]}}]}


async def _absent_until_served(http: aiohttp.ClientSession, api_url: str, router: str, stop: asyncio.Event) -> int:
    """Poll Traefik's API for `router`; the last time (ns) it was seen absent before it appeared."""
    absent = time.time_ns()
    while not stop.is_set():
        before = time.time_ns()
        if await traefik_object(http, api_url, "http/routers", router) is not None:
            return absent
        absent = before
        await asyncio.sleep(0.01)
    return absent


async def test_a_push_is_traced_from_its_traceparent_to_traefik_serving_it(
    traced: Traced, traefik: EmbeddedTraefik, etcd_client: EtcdClient, backends: list[Backend],
) -> None:
    backend = await Backend("traced").start()
    backends.append(backend)
    iid = uid("tr")
    trace_id, parent, traceparent = _traceparent()
    stop = asyncio.Event()
    watching = asyncio.create_task(_absent_until_served(traced.http, traefik.api, f"{AUTHORITY}_{iid}", stop))
    lines: list[dict[str, Any]] = []
    sink = logger.add(lambda message: lines.append(dict(message.record["extra"])), level="INFO")
    ref = IngressRef(AUTHORITY, iid)
    try:
        status = await traced.push("upsert", _body(iid, backend.url),
                                   {"traceparent": traceparent, "X-BackendAI-RequestID": f"req-{iid}"}, wait=True)
        assert status == 204
        last_absent = await asyncio.wait_for(watching, 20)
        stored = await etcd_client.get(traced.daemon.parts.layout.record_key(ref))
        assert stored is not None
    finally:
        logger.remove(sink)
        stop.set()
        await traced.push("remove", {"ingresses": [{"authority": AUTHORITY, "id": iid, "revision": 1}]}, {})
    spans = await traced.spans_of(trace_id, "POST /v2/ingress/upsert", "traefik served")
    by_name = {s.name: s for s in spans}
    server = by_name["POST /v2/ingress/upsert"]
    assert server.kind == SERVER and server.parent_span_id == parent and not server.error
    assert server.attributes == {
        "http.request.method": "POST", "http.route": "/v2/ingress/upsert", "http.response.status_code": 204,
        "exporter.request_id": f"req-{iid}", "exporter.ingresses": 1,
    }
    assert server.resource["service.name"] == "exporter-under-test"
    assert server.resource["service.instance.id"] and server.resource["service.version"]
    # Its steps are events of its span, in order: validated and queued, taken by a batch, carried by a transaction.
    names = [name for name, _attributes, _at in server.events]
    assert names[:2] == ["queued", "batch taken"] and "etcd Txn" in names[2:], names
    times = [at for _name, _attributes, at in server.events]
    assert server.start_ns <= times[0] and times == sorted(times) and times[-1] <= server.end_ns
    committed = {attributes["exporter.revision"] for name, attributes, _at in server.events
                 if name == "etcd Txn" and attributes["exporter.txn.succeeded"]}
    # Created by this push's commit (a fresh daemon may hold its keys for Traefik's first beacon,
    # docs/writer.md: the later commit that writes them puts the record again).
    assert stored.create_revision in committed
    # The batch that wrote it is a trace of its own, linked both ways, with its plan and transactions.
    ((batch_trace, batch_id),) = server.links
    batch_spans = await traced.spans_of(batch_trace, "write batch", "plan", "etcd Txn")
    batch = next(s for s in batch_spans if s.name == "write batch")
    assert batch.span_id == batch_id and (trace_id, server.span_id) in batch.links and batch.start_ns == times[1]
    assert batch.attributes["exporter.pushes"] >= 1 and batch.attributes["exporter.ingresses"] >= 1
    assert all(s.parent_span_id == batch.span_id for s in batch_spans if s is not batch)
    # The transaction that carried the record committed at the revision etcd holds it at.
    txns = [s for s in batch_spans if s.name == "etcd Txn" and s.attributes["exporter.txn.succeeded"]]
    revisions = {s.attributes["exporter.revision"] for s in txns}
    assert stored.create_revision in revisions
    assert txns[0].kind == CLIENT and txns[0].attributes["db.system.name"] == "etcd"
    # The record and its keys together (>= 3 operations), or the record alone while its keys are held.
    held = by_name["traefik served"].attributes["exporter.paced"]
    assert txns[0].attributes["db.operation.name"] == "Txn" and txns[0].attributes["exporter.txn.operations"] >= (1 if held else 3)
    assert by_name["traefik served"].parent_span_id == server.span_id
    served = by_name["traefik served"]
    assert (trace_id, server.span_id) in served.links
    assert served.attributes["exporter.root"] == traced.daemon.parts.layout.root(AUTHORITY)
    # Served by its own commit, or (its keys held) by the later commit that wrote them.
    assert served.attributes["exporter.revision"] >= stored.create_revision
    assert served.attributes["exporter.paced"] is (served.attributes["exporter.revision"] not in revisions)
    assert f"{AUTHORITY}/{iid}" in served.attributes["exporter.ingress_names"]
    assert served.attributes["exporter.observer.poll_interval_s"] > 0
    assert served.start_ns >= min(s.end_ns for s in txns)
    # Traefik did not serve the route before the span ends: it was seen absent at `last_absent`.
    assert served.end_ns >= last_absent
    assert server.end_ns >= served.end_ns
    # The access line was written inside the push's span.
    access = [line for line in lines if line.get("request_id") == f"req-{iid}" and "status" in line]
    assert access and access[0]["trace_id"] == trace_id and access[0]["span_id"] == server.span_id


async def test_a_refused_push_ends_its_span_with_the_error_type(traced: Traced) -> None:
    trace_id, parent, traceparent = _traceparent()
    body = {"ingresses": [{"authority": AUTHORITY, "id": uid("bad"), "revision": 1, "hosts": ["not a host"]}]}
    assert await traced.push("upsert", body, {"traceparent": traceparent}) == 400
    (server,) = await traced.spans_of(trace_id, "POST /v2/ingress/upsert")
    assert server.parent_span_id == parent and server.error and server.status_message == "ValidationFailed"
    assert server.attributes["http.response.status_code"] == 400 and server.attributes["error.type"] == "ValidationFailed"
    assert server.events == [] and server.links == []  # never queued, never in a batch
    spans = [server]
    # Never a body, a token or a header in an attribute.
    text = repr([s.attributes for s in spans])
    assert "not a host" not in text and API_TOKEN not in text


def _config(tmp_path: Path, etcd: EmbeddedEtcd, otel: dict[str, Any]) -> tuple[Path, str, str]:
    space = uid("otelp")
    api, control = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    config = tmp_path / "exporter.yaml"
    config.write_text(yaml.safe_dump({
        "etcd": {"endpoints": [etcd.url]}, "records_prefix": f"{space}/records", "root_key": f"{space}/worker_{{authority}}",
        "api": {"listen": api, "token": API_TOKEN}, "control": {"listen": control}, "log": {"format": "json"}, "otel": otel,
    }))
    return config, f"http://{api}", space


async def _push_one(http: aiohttp.ClientSession, api: str, headers: dict[str, str]) -> None:
    async def pushed() -> bool:
        async with http.post(f"{api}/v2/ingress/upsert", json=_body(uid("p"), "http://127.0.0.1:9"),
                             headers={"Authorization": f"Bearer {API_TOKEN}", **headers}) as resp:
            return resp.status == 204

    await eventually(pushed, timeout=30)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
async def test_a_daemon_process_exports_with_its_headers_and_its_json_lines_name_the_span(
    tmp_path: Path, etcd: EmbeddedEtcd, http: aiohttp.ClientSession, protocol: str,
) -> None:
    collector_token = "collector-token-5e1f0a"
    (tmp_path / "otel-headers").write_text(f"authorization=Bearer {collector_token}\n")
    async with receiver_for(protocol) as receiver:
        config, api, space = _config(tmp_path, etcd, {"enabled": True, "protocol": protocol, "headers_file": "otel-headers"})
        log = tmp_path / "daemon.log"
        # The settings leave the endpoint unset: the standard variable names it.
        proc = start_daemon(config, log, env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100",
                                               "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test"})
        try:
            trace_id, _parent, traceparent = _traceparent()
            await _push_one(http, api, {"traceparent": traceparent})
            spans = await eventually(lambda: holds_trace(receiver, trace_id), timeout=20)
        finally:
            stop_daemon(proc)
        await _delete(etcd, space)
    server = next(s for s in spans if s.name == "POST /v2/ingress/upsert")
    assert server.resource["service.name"] == "traefik-etcd-exporter"
    assert server.resource["deployment.environment"] == "test"
    assert all(h.get("authorization") == f"Bearer {collector_token}" for h in receiver.headers)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    access = [line for line in lines if line["message"].startswith("push POST") and line.get("trace_id") == trace_id]
    assert access and access[0]["span_id"] == server.span_id
    assert collector_token not in log.read_text()


async def holds_trace(receiver: Receiver, trace_id: str) -> list[ReceivedSpan] | None:
    """The spans of `trace_id` once the push's SERVER span is among them."""
    spans = receiver.of_trace(trace_id)
    return spans if any(s.kind == SERVER for s in spans) else None


async def _delete(etcd: EmbeddedEtcd, space: str) -> None:
    async with EtcdClient([etcd.url]) as client:
        await client.delete_prefix(f"{space}/")


async def test_disabled_tracing_sends_nothing_and_never_imports_opentelemetry(
    tmp_path: Path, etcd: EmbeddedEtcd, http: aiohttp.ClientSession,
) -> None:
    async with receiver_for("grpc") as receiver:
        config, api, space = _config(tmp_path, etcd, {"enabled": False, "endpoint": receiver.endpoint})
        log = tmp_path / "daemon.log"
        # Every module the process imports is listed on stderr (Python's -X importtime).
        proc = start_daemon(config, log, env={"PYTHONPROFILEIMPORTTIME": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint})
        try:
            _trace_id, _parent, traceparent = _traceparent()
            await _push_one(http, api, {"traceparent": traceparent})
        finally:
            stop_daemon(proc)
        await _delete(etcd, space)
        assert proc.returncode == 0
    imported = [line for line in log.read_text().splitlines() if line.startswith("import time:")]
    assert any(" exporter.daemon" in line for line in imported)  # the listing is there
    assert not [line for line in imported if "opentelemetry" in line]
    assert receiver.exports == 0


def test_enabled_without_the_extra_refuses_to_start_naming_it(tmp_path: Path, etcd: EmbeddedEtcd) -> None:
    config, _api, _space = _config(tmp_path, etcd, {"enabled": True})
    # An interpreter in which `import opentelemetry` fails, as where the extra is not installed.
    code = "import sys; sys.modules['opentelemetry'] = None; from exporter.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, "run", "--config", str(config)], capture_output=True, text=True, timeout=60,
                          env={**os.environ})
    assert done.returncode == 1
    assert "traefik-etcd-exporter[otel]" in done.stderr and "otel.enabled" in done.stderr


async def test_a_probe_that_ejects_a_server_is_a_span_and_its_notification_carries_traceparent(
    quick_export: None, etcd: EmbeddedEtcd, http: aiohttp.ClientSession, backends: list[Backend],
) -> None:
    notified: list[tuple[str, list[dict[str, Any]]]] = []

    async def coordinator(request: web.Request) -> web.Response:
        notified.append((request.headers.get("traceparent", ""), (await request.json())["events"]))
        return web.Response(status=204)

    port = free_port()
    runner = await serve_all_paths(port, coordinator)
    backend = await Backend("probed").start()
    backends.append(backend)
    iid = uid("hp")
    async with receiver_for("grpc") as receiver:
        daemon = Daemon(settings_for(
            etcd.url, records_prefix=f"{uid('otelh')}/records", root_key=f"{uid('otelh')}/worker_{{authority}}",
            api={"listen": f"127.0.0.1:{free_port()}", "token": API_TOKEN}, control={"listen": f"127.0.0.1:{free_port()}"},
            health={"notify_url": f"http://127.0.0.1:{port}/events"},
            otel={"enabled": True, "endpoint": receiver.endpoint},
        ))
        await daemon.start()
        try:
            await daemon.parts.reconciler.wait_synced(30)
            body = _body(iid, backend.url)
            body["ingresses"][0]["health_check"] = {"enable": True, "interval": 0.2, "max_retries": 1, "max_wait_time": 0.5,
                                                    "initial_delay": 0}
            assert await Traced(daemon, receiver, http).push("upsert", body, {}) == 204
            # A new server is routed once a probe succeeds; then it dies.
            await eventually(lambda: holds([e for _tp, batch in notified for e in batch if e["id"] == iid and e["to"] == "routed"]))
            await backend.stop()
            sent = await eventually(lambda: holds(
                [(tp, e) for tp, batch in notified for e in batch if e["id"] == iid and e["to"] == "not_routed"]), timeout=20)
            traceparent = sent[0][0]
            _version, trace_id, span_id, _flags = traceparent.split("-")
            spans = await eventually(lambda: holds(receiver.of_trace(trace_id)), timeout=20)
            probes = await eventually(lambda: holds(receiver.where(
                lambda s: s.name == "health probe" and s.attributes["exporter.health.node"] == backend.url
                and s.events[0][1]["exporter.health.routed"] == "false")), timeout=20)
        finally:
            await daemon.stop()
            await runner.cleanup()
    call = next(s for s in spans if s.span_id == span_id)
    assert call.kind == CLIENT and call.name == "POST" and call.attributes["http.response.status_code"] == 204
    assert call.attributes["server.port"] == port and call.attributes["exporter.notification.events"] >= 1
    probe = probes[0]
    (event, change, _at), = probe.events
    assert event == "state change" and change["exporter.ingress"] == f"{AUTHORITY}/{iid}" and change["exporter.health.routed"] == "false"
    assert (probe.trace_id, probe.span_id) in call.links
    assert probe.start_ns <= probe.end_ns <= call.start_ns


async def holds(items: list[Any]) -> list[Any] | None:
    """`items` once there are some."""
    return items or None
