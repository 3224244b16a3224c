"""The coordinator push API on a real etcd and Traefik: every status code, revisions, hostile input."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from exporter.assembly import build_reconciler
from exporter.daemon import Daemon
from exporter.embedded import EmbeddedEtcd, EmbeddedTraefik, free_port
from exporter.etcd.client import EtcdClient
from exporter.keys import IngressRef
from exporter.store.records import Removal
from tests.conftest import API_MAX_BODY, API_RECORDS, API_TOKEN, ROOT, settings_for
from tests.helpers import (
    AUTHORITY,
    REPO,
    Backend,
    eventually,
    footprint,
    record,
    router_enabled,
    serves,
    start_daemon,
    stop_daemon,
    uid,
)

pytestmark = pytest.mark.integration
OPENAPI = yaml.safe_load((REPO / "docs" / "openapi.yaml").read_text())


def ing(iid: str, revision: Any = 1, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "authority": AUTHORITY, "id": iid, "revision": revision, "hosts": [f"{iid}.test"],
        "upstream": {"servers": [{"url": "http://127.0.0.1:9"}]},
    }
    body.update(fields)
    return body


class Api:
    def __init__(self, listen: str, session: aiohttp.ClientSession) -> None:
        self.base = f"http://{listen}"
        self.session = session

    async def call(
        self, method: str, path: str, body: Any = None, *, token: str | None = API_TOKEN,
        raw: bytes | None = None, content_type: str = "application/json",
    ) -> tuple[int, Any]:
        headers = {"Content-Type": content_type}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        async with self.session.request(method, self.base + path, data=data, headers=headers) as resp:
            text = await resp.text()
            payload = json.loads(text) if text else None
            _check_openapi(method, path.split("?")[0], resp.status, payload)
            return resp.status, payload

    async def upsert(self, *ingresses: dict[str, Any], **kw: Any) -> tuple[int, Any]:
        return await self.call("POST", "/v2/ingress/upsert", {"ingresses": list(ingresses)}, **kw)

    async def remove(self, *refs: tuple[str, int], **kw: Any) -> tuple[int, Any]:
        body = {"ingresses": [{"authority": AUTHORITY, "id": i, "revision": r} for i, r in refs]}
        return await self.call("POST", "/v2/ingress/remove", body, **kw)

    async def stored(self) -> dict[str, int]:
        status, body = await self.call("GET", f"/v2/ingress?authority={AUTHORITY}")
        assert status == 200
        return {i["id"]: i["revision"] for i in body["ingresses"]}


def _check_openapi(method: str, path: str, status: int, payload: Any) -> None:
    """Every answer must be one the OpenAPI document declares, with a body of the declared shape."""
    import jsonschema

    operation = OPENAPI["paths"][path][method.lower()]
    assert str(status) in operation["responses"], f"{method} {path} answered undocumented {status}"
    response = operation["responses"][str(status)]
    if "$ref" in response:
        response = OPENAPI["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    if "content" not in response:
        assert payload is None
        return
    # `#/components/...` references resolve against this wrapper, which carries the components.
    schema = {**response["content"]["application/json"]["schema"], "components": OPENAPI["components"]}
    jsonschema.validate(payload, schema, cls=jsonschema.Draft202012Validator)


@pytest.fixture
async def api(api_daemon: Daemon, http: aiohttp.ClientSession) -> AsyncIterator[Api]:
    client = Api(api_daemon.settings.api.listen, http)
    yield client
    stored = await client.stored()
    leftovers = [(i, r) for i, r in stored.items()]
    if leftovers:
        await client.remove(*leftovers)


async def written(etcd_client: EtcdClient, *ids: str) -> dict[str, int]:
    """What a push to the API daemon could have written (tests/helpers.py `footprint`)."""
    return await footprint(etcd_client, API_RECORDS, ROOT, *ids)


async def test_upsert_204_after_commit_then_idempotent_retry(
    api: Api, etcd_client: EtcdClient, traefik: EmbeddedTraefik, http: aiohttp.ClientSession, backends: list[Backend]
) -> None:
    backends.append(await Backend("pushed").start())
    iid = uid()
    body = ing(iid, upstream={"servers": [{"url": backends[0].url}]})
    assert await api.upsert(body) == (204, None)
    # 204 means committed: the keys are in etcd right now.
    kv = await etcd_client.get(f"{ROOT}/http/routers/{AUTHORITY}_{iid}/rule")
    assert kv is not None and kv.value == f"Host(`{iid}.test`)"
    await eventually(lambda: serves(http, traefik.url("web"), f"{iid}.test", body="pushed"))
    before = await written(etcd_client, iid)
    assert await api.upsert(body) == (204, None)
    assert await written(etcd_client, iid) == before
    assert (await api.stored())[iid] == 1


async def test_the_mirror_endpoint_names_a_revision_whose_range_read_of_etcd_hashes_to_its_digest(
    api: Api, api_daemon: Daemon, etcd_client: EtcdClient, http: aiohttp.ClientSession
) -> None:
    for iid in (uid(), uid()):
        assert await api.upsert(ing(iid, upstream={"servers": [{"url": "http://127.0.0.1:9"}]})) == (204, None)
    async with http.get(f"http://{api_daemon.settings.control.listen}/v1/mirror") as resp:
        assert resp.status == 200
        mirror = await resp.json()
    # The roots prefix and the records prefix: the two ranges the one watch covers.
    assert mirror["prefixes"][0] == "traefik/worker_" and mirror["prefixes"][1].startswith(API_RECORDS)
    kvs = [kv for prefix in mirror["prefixes"] for kv in (await etcd_client.range_prefix(prefix, revision=mirror["revision"])).kvs]
    sha = hashlib.sha256()
    for kv in sorted(kvs, key=lambda kv: kv.key.encode()):
        sha.update(kv.key.encode() + b"\0" + kv.value.encode() + b"\0" + str(kv.mod_revision).encode() + b"\n")
    assert mirror["keys"] == len(kvs) > 0 and mirror["digest"] == sha.hexdigest()


async def test_stale_and_conflicting_revisions_are_409_and_write_nothing(api: Api, etcd_client: EtcdClient) -> None:
    iid = uid()
    assert (await api.upsert(ing(iid, revision=5)))[0] == 204
    before = await written(etcd_client, iid)
    status, body = await api.upsert(ing(iid, revision=4))
    assert status == 409 and body["type"] == "StaleRevisionError"
    assert body["data"] == {"authority": AUTHORITY, "id": iid, "stored_revision": 5, "request_id": body["data"]["request_id"]}
    status, body = await api.upsert(ing(iid, revision=5, path_prefix="/other"))
    assert status == 409 and body["data"]["stored_revision"] == 5
    status, body = await api.remove((iid, 3))
    assert status == 409
    assert await written(etcd_client, iid) == before
    assert (await api.upsert(ing(iid, revision=6, path_prefix="/other")))[0] == 204


async def test_remove_is_204_and_safe_to_retry_and_an_unknown_one_leaves_a_tombstone(api: Api, etcd_client: EtcdClient) -> None:
    iid, unknown = uid(), uid()
    assert (await api.upsert(ing(iid, revision=2)))[0] == 204
    assert await api.remove((iid, 2)) == (204, None)
    assert await etcd_client.get(f"{ROOT}/http/routers/{AUTHORITY}_{iid}/rule") is None
    before = await written(etcd_client, iid)
    assert await api.remove((iid, 2)) == (204, None)
    assert await api.remove((iid, 1)) == (204, None)
    assert await written(etcd_client, iid) == before
    assert iid not in await api.stored()
    # An ingress never stored: one small record, nothing under the root.
    assert await api.remove((unknown, 1)) == (204, None)
    tomb = await etcd_client.get(f"{API_RECORDS}/{AUTHORITY}/{unknown}")
    assert tomb is not None and json.loads(tomb.value)["removed"] and json.loads(tomb.value)["ingress"]["revision"] == 1
    assert [key for key in await written(etcd_client, unknown) if key.startswith(f"{ROOT}/")] == []


async def test_get_lists_every_ingress_and_filters_by_authority(api: Api) -> None:
    ids = sorted(uid() for _ in range(3))
    assert (await api.upsert(*(ing(i, revision=n + 1) for n, i in enumerate(ids))))[0] == 204
    stored = await api.stored()
    assert {i: stored[i] for i in ids} == {ids[0]: 1, ids[1]: 2, ids[2]: 3}
    status, body = await api.call("GET", "/v2/ingress?authority=nobody")
    assert (status, body) == (200, {"ingresses": []})


@pytest.mark.parametrize("token", [None, "wrong", "", f"{API_TOKEN}x"])
async def test_401_without_the_right_token_writes_nothing(api: Api, etcd_client: EtcdClient, token: str | None) -> None:
    iid = uid()
    before = await written(etcd_client, iid)
    status, body = await api.upsert(ing(iid), token=token)
    assert status == 401 and body["type"] == "Unauthorized"
    assert API_TOKEN not in json.dumps(body)
    assert (await api.call("GET", "/v2/ingress", token=token))[0] == 401
    assert await written(etcd_client, iid) == before


async def test_401_comes_before_the_body_is_read(api: Api) -> None:
    status, _body = await api.call("POST", "/v2/ingress/upsert", raw=b"x" * (API_MAX_BODY * 4), token="wrong")
    assert status == 401


async def test_415_for_a_body_that_is_not_json(api: Api, etcd_client: EtcdClient) -> None:
    before = await written(etcd_client)
    status, body = await api.call("POST", "/v2/ingress/upsert", raw=b"ingresses: []", content_type="application/yaml")
    assert status == 415 and body["type"] == "UnsupportedMediaType"
    assert await written(etcd_client) == before


async def test_413_just_over_the_limit_and_accepted_just_under(api: Api, etcd_client: EtcdClient) -> None:
    iid = uid()
    payload = json.dumps({"ingresses": [ing(iid)]}).encode()
    under = payload + b" " * (API_MAX_BODY - len(payload))
    over = under + b" "
    before = await written(etcd_client, iid)
    status, body = await api.call("POST", "/v2/ingress/upsert", raw=over)
    assert status == 413 and body["type"] == "BodyTooLarge"
    assert await written(etcd_client, iid) == before
    assert (await api.call("POST", "/v2/ingress/upsert", raw=under))[0] == 204


def _deep(n: int) -> bytes:
    return b'{"ingresses": ' + b"[" * n + b"]" * n + b"}"


HOSTILE: list[tuple[str, Any]] = [
    ("rule injection in host", {"ingresses": [ing("evil", hosts=["a.test`) || Host(`b.test"])]}),
    ("rule injection in path", {"ingresses": [ing("evil", path_prefix="/x`) || PathPrefix(`/")]}),
    ("key injection in id", {"ingresses": [ing("../../tls/x")]}),
    ("slash in authority", {"ingresses": [ing("evil", authority="test/http")]}),
    ("unicode host", {"ingresses": [ing("evil", hosts=["évil.test"])]}),
    ("unicode lookalike id", {"ingresses": [ing("\u0435vil")]}),
    ("numeric id", {"ingresses": [ing("12345")]}),
    ("provider separator", {"ingresses": [ing("evil@etcd")]}),
    ("comma in a list element", {"ingresses": [ing("evil", allowed_client_ips=["10.0.0.0/8,0.0.0.0/0"])]}),
    ("too many hosts", {"ingresses": [ing("evil", hosts=[f"h{n}.test" for n in range(33)])]}),
    ("too many servers", {"ingresses": [ing("evil",
                                            upstream={"servers": [{"url": f"http://10.0.0.{n % 250}:{1000 + n}"} for n in range(257)]})]}),
    ("wrong types", {"ingresses": [ing("evil", revision="7", hosts="a.test")]}),
    ("null body", None),
    ("list body", [ing("evil")]),
    ("unknown field", {"ingresses": [ing("evil", hostz=["a.test"])]}),
    ("duplicate ids", {"ingresses": [ing("dup"), ing("dup", revision=2)]}),
    ("canary weight 100", {"ingresses": [ing("evil", canary={"weight": 100, "upstream": {"servers": [{"url": "http://127.0.0.1:9"}]}})]}),
    ("CRLF in check header", {"ingresses": [ing("evil", upstream={"kind": "ai-proxy-multi", "instances": [
        {"name": "a", "url": "http://127.0.0.1:9", "checks": {"headers": {"X": "a\r\nB: c"}}}]})]}),
    ("server url with credentials", {"ingresses": [ing("evil", upstream={"servers": [{"url": "http://u:p@127.0.0.1:9"}]})]}),
]


@pytest.mark.parametrize(("case", "body"), HOSTILE, ids=[c for c, _ in HOSTILE])
async def test_hostile_input_gets_a_clear_400_and_changes_nothing(api: Api, etcd_client: EtcdClient, case: str, body: Any) -> None:
    before = await written(etcd_client)
    status, answer = await api.call("POST", "/v2/ingress/upsert", body)
    assert status == 400, (case, answer)
    assert answer["type"] == "ValidationFailed"
    assert answer["data"]["errors"] and all(e["msg"] for e in answer["data"]["errors"])
    assert await written(etcd_client) == before


_TCP = {"protocol": "tcp", "hosts": [], "upstream": {"servers": [{"url": "tcp://127.0.0.1:9"}]}}
# Accepted once and without effect in Traefik: each refused naming the field (docs/ingress.md).
NO_EFFECT: list[tuple[str, dict[str, Any], str, str]] = [
    ("depth with excluded_ips",
     {"allowed_client_ips": ["10.0.0.0/8"], "allowed_client_ips_strategy": {"depth": 1, "excluded_ips": ["10.9.0.0/16"]}},
     "allowed_client_ips_strategy", "Traefik ignores excluded_ips"),
    ("tcp strategy", {**_TCP, "allowed_client_ips": ["10.0.0.0/8"], "allowed_client_ips_strategy": {"depth": 1}},
     "allowed_client_ips_strategy", "not supported for tcp"),
    ("tcp health path", {**_TCP, "health_check": {"enable": True, "path": "/ready"}}, "health_check.path", "TCP connect"),
    ("tcp expected status", {**_TCP, "health_check": {"expected_status_code": 204}}, "health_check.expected_status_code", "TCP connect"),
    ("tcp weight", {**_TCP, "upstream": {"servers": [{"url": "tcp://127.0.0.1:9", "weight": 2}]}}, "upstream", "cannot weight tcp"),
    ("tcp plugin kind", {**_TCP, "upstream": {"kind": "tcp-connect", "servers": [{"url": "tcp://127.0.0.1:9"}]}},
     "upstream", "kind 'servers'"),
    ("tcp ai-proxy-multi", {**_TCP, "upstream": {"kind": "ai-proxy-multi", "instances": [{"name": "a", "url": "http://127.0.0.1:9"}]}},
     "upstream", "kind 'servers'"),
    ("tcp path_prefix", {**_TCP, "path_prefix": "/x"}, "path_prefix", "route by path"),
    ("tcp canary of another kind", {**_TCP, "canary": {"weight": 10, "upstream": {"kind": "tcp-connect", "servers": [{"url": "tcp://127.0.0.1:9"}]}}},
     "upstream", "kind 'servers'"),
    ("tcp upstream_tls", {**_TCP, "upstream_tls": {"server_name": "a.test"}}, "upstream_tls", "not supported for tcp"),
    ("tcp tls", {**_TCP, "tls": True}, "tls", "not supported for tcp"),
    ("tcp middlewares", {**_TCP, "middlewares": ["cors@file"]}, "middlewares", "not supported for tcp"),
    ("tcp edge field", {**_TCP, "keepalive": False}, "keepalive", "not supported for tcp"),
    ("tls domains without a resolver", {"tls": {"domains": [{"main": "a.test"}]}}, "tls.domains", "cert_resolver"),
    ("upstream_tls without https", {"upstream_tls": {"server_name": "a.test"}}, "upstream_tls", "https://"),
]


@pytest.mark.parametrize(("case", "fields", "field", "reason"), NO_EFFECT, ids=[c for c, *_ in NO_EFFECT])
async def test_a_field_traefik_would_ignore_is_refused_naming_it_and_changes_nothing(
    api: Api, etcd_client: EtcdClient, case: str, fields: dict[str, Any], field: str, reason: str
) -> None:
    iid = f"noeffect-{uid()}"
    before = await written(etcd_client, iid)
    status, answer = await api.call("POST", "/v2/ingress/upsert", {"ingresses": [ing(iid, **fields)]})
    assert status == 400, (case, answer)
    assert any(field in e["loc"] + e["msg"] and reason in e["msg"] for e in answer["data"]["errors"]), answer
    assert await written(etcd_client, iid) == before


@pytest.mark.parametrize("raw", [b"{not json", _deep(100_000), b'{"ingresses": [' + b"1," * 5000 + b"1]}", b"\xff\xfe"])
async def test_malformed_and_pathological_json_is_400(api: Api, etcd_client: EtcdClient, raw: bytes) -> None:
    before = await written(etcd_client)
    status, answer = await api.call("POST", "/v2/ingress/upsert", raw=raw[:API_MAX_BODY])
    assert status == 400, answer
    assert "Traceback" not in json.dumps(answer)
    assert await written(etcd_client) == before


async def test_503_when_etcd_is_unreachable_and_nothing_is_written(http: aiohttp.ClientSession) -> None:
    settings = settings_for(
        f"http://127.0.0.1:{free_port()}",
        api={"listen": f"127.0.0.1:{free_port()}", "token": API_TOKEN},
        control={"listen": f"127.0.0.1:{free_port()}"},
    )
    settings.etcd.timeout = 0.5
    daemon = Daemon(settings)
    await daemon.start()
    try:
        api = Api(daemon.settings.api.listen, http)
        status, body = await api.upsert(ing(uid()))
        assert status == 503 and body["type"] == "EtcdUnavailable"
        assert (await api.call("GET", "/v2/ingress"))[0] == 503
        async with http.get(f"http://{settings.control.listen}/readyz") as resp:
            assert resp.status == 503
            assert "etcd unreachable" in json.dumps(await resp.json())
    finally:
        await daemon.stop()


async def test_coordinator_simulation_50_clients_500_ingresses(
    api: Api, api_daemon: Daemon, etcd_client: EtcdClient, traefik: EmbeddedTraefik, http: aiohttp.ClientSession
) -> None:
    ids = [uid("c") for _ in range(500)]
    # revisions 1..4: upsert, upsert, remove (every 5th), upsert again (every 10th)
    final: dict[str, int | None] = {}
    plan: list[list[tuple[str, int, str]]] = [[] for _ in range(50)]
    for n, iid in enumerate(ids):
        ops = [(iid, 1, "upsert"), (iid, 2, "upsert")]
        if n % 5 == 0:
            ops.append((iid, 3, "remove"))
            if n % 10 == 0:
                ops.append((iid, 4, "upsert"))
        final[iid] = None if ops[-1][2] == "remove" else ops[-1][1]
        plan[n % 50].extend(ops)  # one client owns an ingress: its revisions arrive in order

    async def client(ops: list[tuple[str, int, str]]) -> None:
        # Interleave this client's ingresses: all revision-1 ops, then revision 2, ...
        for iid, rev, kind in sorted(ops, key=lambda o: (o[1], o[0])):
            if kind == "upsert":
                status, body = await api.upsert(ing(iid, revision=rev, path_prefix=f"/r{rev}"))
            else:
                status, body = await api.remove((iid, rev))
            assert status == 204, body

    await asyncio.gather(*(client(ops) for ops in plan))
    stored = await api.stored()
    assert {i: stored.get(i) for i in ids} == final
    kvs = (await etcd_client.range_prefix(f"{ROOT}/http/routers/")).kvs
    rules = {kv.key.split("/")[4]: kv.value for kv in kvs if kv.key.endswith("/rule")}
    for iid, rev in final.items():
        name = f"{AUTHORITY}_{iid}"
        if rev is None:
            assert name not in rules
        else:
            assert rules[name] == f"Host(`{iid}.test`) && PathPrefix(`/r{rev}`)"
    for iid in (ids[1], ids[10], ids[499]):
        rev = final[iid]
        await eventually(lambda: serves(http, traefik.url("web"), f"{iid}.test", path=f"/r{rev}/x", status=502))  # backend port 9 is closed
    await eventually(lambda: serves(http, traefik.url("web"), f"{ids[5]}.test", path="/r2/x", status=404))  # removed


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("TRACE", "/v2/ingress", {"GET", "HEAD"}), ("GET", "/v2/ingress/upsert", {"POST"}), ("PUT", "/v2/ingress/remove", {"POST"}),
])
async def test_a_method_the_path_does_not_take_is_405_with_allow(
    api_daemon: Daemon, http: aiohttp.ClientSession, method: str, path: str, allowed: set[str]
) -> None:
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    async with http.request(method, f"http://{api_daemon.settings.api.listen}{path}", headers=headers) as resp:
        assert resp.status == 405
        assert {m.strip() for m in resp.headers["Allow"].split(",")} == allowed
        body = await resp.json()
    assert body["type"] == "HTTPMethodNotAllowed" and body["data"]["request_id"]


def test_the_openapi_document_lists_exactly_the_served_routes(api_daemon: Daemon) -> None:
    from exporter.sources.api import push_api_app

    app = push_api_app(api_daemon.parts.reconciler, token="x", max_body_bytes=1024)
    served = {(r.method.lower(), r.resource.canonical) for r in app.router.routes() if r.resource is not None}
    documented = {(m, p) for p, ops in OPENAPI["paths"].items() for m in ops}
    assert served - {("head", "/v2/ingress")} == documented


async def test_restart_keeps_every_ingress_and_revision(tmp_path: Path, etcd: EmbeddedEtcd, http: aiohttp.ClientSession) -> None:
    records = uid("restart")
    config = tmp_path / "exporter.yaml"
    config.write_text(f'etcd: {{endpoints: ["{etcd.url}"]}}\nrecords_prefix: "{records}/records"\n')
    listen = f"127.0.0.1:{free_port()}"
    env = {"EXPORTER_API__TOKEN": API_TOKEN, "EXPORTER_API__LISTEN": listen,
           "EXPORTER_CONTROL__LISTEN": f"127.0.0.1:{free_port()}", "EXPORTER_LOG__FORMAT": "json"}
    log = tmp_path / "daemon.log"
    api = Api(listen, http)
    ids = [uid() for _ in range(5)]
    proc = start_daemon(config, log, env=env)
    try:
        await eventually(lambda: _api_up(api), timeout=30)
        assert (await api.upsert(*(ing(i, revision=n + 3) for n, i in enumerate(ids))))[0] == 204
        proc.kill()
        proc.wait(10)
        proc = start_daemon(config, log, env=env)
        await eventually(lambda: _api_up(api), timeout=30)
        stored = await api.stored()
        assert {i: stored[i] for i in ids} == {i: n + 3 for n, i in enumerate(ids)}
        assert (await api.remove(*((i, n + 3) for n, i in enumerate(ids))))[0] == 204
    finally:
        stop_daemon(proc)
    assert API_TOKEN not in log.read_text()
    async with EtcdClient([etcd.url]) as client:
        await client.delete_prefix(f"{records}/")


MALFORMED = [
    b"GET /v2/ingress HTTP/1.1\r\nHost: x\r\nX-Token: a\x00b\r\n\r\n",  # a NUL byte in a header value
    b"GET /v2/ingress HTTP/9\r\nHost: x\r\n\r\n",  # a bad request line
    b"GET /v2/ingress HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n",  # an oversized header
]


async def _raw(listen: str, request: bytes) -> bytes:
    host, _, port = listen.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


async def test_requests_the_parser_refuses_are_logged_as_the_daemons_own_json_lines_and_counted(
    tmp_path: Path, etcd: EmbeddedEtcd, http: aiohttp.ClientSession
) -> None:
    config = tmp_path / "exporter.yaml"
    config.write_text(f'etcd: {{endpoints: ["{etcd.url}"]}}\nrecords_prefix: "{uid("malformed")}/records"\n')
    listen, control = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    env = {"EXPORTER_API__TOKEN": API_TOKEN, "EXPORTER_API__LISTEN": listen, "EXPORTER_CONTROL__LISTEN": control,
           "EXPORTER_LOG__FORMAT": "json"}
    log = tmp_path / "daemon.log"
    proc = start_daemon(config, log, env=env)
    try:
        await eventually(lambda: _api_up(Api(listen, http)), timeout=30)
        for request in MALFORMED:
            assert (await _raw(listen, request)).split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), request[:40]
        async with http.get(f"http://{control}/metrics") as resp:
            metrics = await resp.text()
        assert 'exporter_api_requests_total{route="malformed",status="400"} 3.0' in metrics
    finally:
        stop_daemon(proc)
    lines = log.read_text().splitlines()
    assert [line for line in lines if not line.startswith("{")] == []
    refused = [json.loads(line) for line in lines if "refused a malformed request" in line]
    assert len(refused) == 3 and {r["level"] for r in refused} == {"WARNING"} and all(r["status"] == 400 for r in refused)
    assert all("exception" not in r and "aaaa" not in r["message"] for r in refused)


async def _api_up(api: Api) -> bool:
    status, _ = await api.call("GET", "/v2/ingress")
    return status == 200


async def test_random_valid_ingresses_are_accepted_by_a_real_traefik(
    api: Api, traefik: EmbeddedTraefik, http: aiohttp.ClientSession, backends: list[Backend]
) -> None:
    """Property check against Traefik itself: every generated router enabled, the provider not frozen."""
    import warnings

    from tests.strategies import http_ingress

    def examples() -> list[dict[str, Any]]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # .example() outside @given: the daemon lives on this test's loop
            strategy = http_ingress()
            return [strategy.example() for _ in range(25)]

    # Generated off the loop: seconds of generation on it would leave the daemon silent to etcd, and not ready.
    batch = await asyncio.to_thread(examples)
    prefix = uid("p")
    for n, body in enumerate(batch):
        body["id"] = f"{prefix}-{n}"
    assert (await api.upsert(*batch))[0] == 204
    for body in batch:
        await eventually(lambda: router_enabled(http, traefik.api, f"{AUTHORITY}_{body['id']}"), timeout=20)
    # The provider still applies updates: nothing generated froze it.
    backends.append(await Backend("after-batch").start())
    probe = uid()
    assert (await api.upsert(ing(probe, upstream={"servers": [{"url": backends[0].url}]})))[0] == 204
    await eventually(lambda: serves(http, traefik.url("web"), f"{probe}.test", body="after-batch"))


async def test_an_upsert_older_than_a_removal_cannot_resurrect_the_ingress(api: Api, etcd_client: EtcdClient) -> None:
    iid = uid()
    assert (await api.upsert(ing(iid, revision=3)))[0] == 204
    assert (await api.remove((iid, 4)))[0] == 204
    before = await written(etcd_client, iid)
    for stale in (3, 4):
        status, body = await api.upsert(ing(iid, revision=stale))
        assert status == 409 and body["data"]["stored_revision"] == 4
    assert await written(etcd_client, iid) == before
    assert iid not in await api.stored()
    assert await api.remove((iid, 2)) == (204, None)  # already removed: no-op
    assert (await api.upsert(ing(iid, revision=5)))[0] == 204
    assert (await api.stored())[iid] == 5


async def test_an_acknowledged_remove_refuses_every_older_upsert_after_it(
    api: Api, etcd_client: EtcdClient, traefik: EmbeddedTraefik, http: aiohttp.ClientSession, backends: list[Backend]
) -> None:
    # A coordinator's sequence, one request at a time: a remove newer than a tombstone moves the
    # tombstone up, so a straggling upsert between the two removes is refused and never served.
    backends.append(await Backend("tomb").start())
    upstream = {"servers": [{"url": backends[-1].url}]}
    iid = uid()
    assert (await api.upsert(ing(iid, revision=1, upstream=upstream)))[0] == 204
    await eventually(lambda: serves(http, traefik.url("web"), f"{iid}.test", body="tomb"))
    assert await api.remove((iid, 2)) == (204, None)
    assert await api.remove((iid, 4)) == (204, None)
    before = await written(etcd_client, iid)
    status, body = await api.upsert(ing(iid, revision=3, upstream=upstream))
    assert status == 409 and body["data"]["stored_revision"] == 4
    assert await written(etcd_client, iid) == before
    await eventually(lambda: serves(http, traefik.url("web"), f"{iid}.test", status=404))
    assert (await api.upsert(ing(iid, revision=5, upstream=upstream)))[0] == 204
    await eventually(lambda: serves(http, traefik.url("web"), f"{iid}.test", body="tomb"))
    # The same for an ingress this sidecar never had.
    never = uid()
    assert await api.remove((never, 3)) == (204, None)
    before = await written(etcd_client, never)
    status, body = await api.upsert(ing(never, revision=2, upstream=upstream))
    assert status == 409 and body["data"]["stored_revision"] == 3
    assert await written(etcd_client, never) == before
    assert (await api.upsert(ing(never, revision=5, upstream=upstream)))[0] == 204
    await eventually(lambda: serves(http, traefik.url("web"), f"{never}.test", body="tomb"))


async def test_tombstones_expire_after_their_ttl(etcd: EmbeddedEtcd) -> None:
    space = uid("ttl")
    async with EtcdClient([etcd.url]) as client:
        settings = settings_for(etcd.url, records_prefix=f"{space}/records", writer={"tombstone_ttl": 0, "coalesce_window": 0.01})
        rec = build_reconciler(settings, client)
        await rec.start()
        await rec.wait_synced(20)
        try:
            iid = uid()
            await rec.submit([record(iid, upstream={"servers": [{"url": "http://127.0.0.1:9"}]})])
            await rec.submit([], [Removal(IngressRef(AUTHORITY, iid), 2)])
            tomb = await client.get(f"{space}/records/{AUTHORITY}/{iid}")
            assert tomb is not None and '"removed":true' in tomb.value
            passes = rec.status.full_passes
            rec.request_full()
            await eventually(lambda: _gone(client, f"{space}/records/{AUTHORITY}/{iid}", rec, passes))
        finally:
            await rec.stop()
            await client.delete_prefix(f"{space}/")


async def _gone(client: EtcdClient, key: str, rec: Any, passes: int) -> bool:
    return rec.status.full_passes > passes and await client.get(key) is None


async def test_backendai_credentials_reach_the_real_server_and_wrong_ones_write_nothing(
    api_daemon: Daemon, etcd_client: EtcdClient, http: aiohttp.ClientSession
) -> None:
    import jwt

    from tests.conftest import JWT_SECRET

    base = f"http://{api_daemon.settings.api.listen}"
    iid = uid()
    body = {"ingresses": [ing(iid)]}
    before = await written(etcd_client, iid)
    for header in ({"X-BackendAI-Token": "wrong"}, {"Authorization": "Bearer " + jwt.encode({"exp": 1}, JWT_SECRET)}):
        async with http.post(f"{base}/v2/ingress/upsert", json=body, headers=header) as resp:
            assert resp.status == 401 and (await resp.json())["title"] == "missing or wrong credentials"
    assert await written(etcd_client, iid) == before
    async with http.post(f"{base}/v2/ingress/upsert", json=body, headers={"X-BackendAI-Token": API_TOKEN}) as resp:
        assert resp.status == 204, await resp.text()
    token = jwt.encode({"sub": "coordinator", "exp": int(time.time()) + 60}, JWT_SECRET, algorithm="HS256")
    async with http.post(f"{base}/v2/ingress/remove", json={"ingresses": [{"authority": AUTHORITY, "id": iid, "revision": 1}]},
                         headers={"Authorization": f"Bearer {token}"}) as resp:
        assert resp.status == 204, await resp.text()


async def test_every_push_is_logged_once_under_its_request_id_and_errors_name_it(
    api: Api, api_daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    from loguru import logger

    lines: list[dict[str, Any]] = []
    sink = logger.add(lambda m: lines.append({"text": m.record["message"], **m.record["extra"]}), level="INFO")
    try:
        iid = uid()
        base = f"http://{api_daemon.settings.api.listen}"
        headers = {"Authorization": f"Bearer {API_TOKEN}", "Content-Type": "application/json", "X-BackendAI-RequestID": "coord-42.a:b"}
        body = json.dumps({"ingresses": [ing(iid)]})
        async with http.post(f"{base}/v2/ingress/upsert", data=body, headers=headers) as resp:
            assert resp.status == 204 and resp.headers["X-BackendAI-RequestID"] == "coord-42.a:b"
        async with http.post(f"{base}/v2/ingress/upsert", data=body.replace('"revision": 1', '"revision": 0'),
                             headers={**headers, "X-BackendAI-RequestID": "bad id; " + "x" * 200}) as resp:
            refused = await resp.json()
            generated = resp.headers["X-BackendAI-RequestID"]
        # A hostile id is not taken: a generated one is echoed, named in the body, and logged.
        assert resp.status == 409 and refused["data"]["request_id"] == generated and len(generated) == 32
        async with http.get(f"{base}/v2/ingress", headers={"Authorization": f"Bearer {API_TOKEN}"}) as resp:
            assert resp.status == 200 and resp.headers["X-BackendAI-RequestID"]
    finally:
        logger.remove(sink)
    access = [line for line in lines if line["text"].startswith("push ")]
    assert [(a["request_id"], a["status"], a["ingresses"]) for a in access] == [("coord-42.a:b", 204, 1), (generated, 409, 1)]
    assert access[0]["route"] == "/v2/ingress/upsert" and "ms ingresses=1 request_id=coord-42.a:b" in access[0]["text"]
    # Never the token or the body.
    assert not any(API_TOKEN in line["text"] or iid in line["text"] for line in access)
