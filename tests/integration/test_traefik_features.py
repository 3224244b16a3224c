"""Each ingress feature, written to a real etcd and served by a real Traefik."""

from __future__ import annotations

import asyncio
import ssl
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509

from exporter.embedded import EmbeddedTraefik
from exporter.etcd.client import EtcdClient
from tests.conftest import ROOT, Ingresses
from tests.helpers import (
    AUTHORITY,
    Backend,
    BannerServer,
    eventually,
    get_via,
    record,
    router_enabled,
    serves,
    tls_backend_context,
    traefik_object,
    uid,
)

pytestmark = pytest.mark.integration


def name_of(ingress_id: str) -> str:
    return f"{AUTHORITY}_{ingress_id}"


async def test_host_rule_routes_only_its_host(
    ingresses: Ingresses, backends: list[Backend], traefik: EmbeddedTraefik, http: aiohttp.ClientSession
) -> None:
    backends.append(await Backend("hosted").start())
    iid = uid()
    await ingresses.upsert(record(iid, upstream={"servers": [{"url": backends[0].url}]}))
    web = traefik.url("web")
    assert await eventually(lambda: _answers(http, web, f"{iid}.test", "/", "hosted"))
    await eventually(lambda: router_enabled(http, traefik.api, name_of(iid)))
    status, _ = await get_via(http, web, f"other-{iid}.test")
    assert status == 404


async def test_path_prefix_routes_only_under_it(
    ingresses: Ingresses, backends: list[Backend], traefik: EmbeddedTraefik, http: aiohttp.ClientSession
) -> None:
    backends.append(await Backend("api-v1").start())
    iid = uid()
    await ingresses.upsert(record(iid, path_prefix="/v1", upstream={"servers": [{"url": backends[0].url}]}))
    web = traefik.url("web")
    assert await eventually(lambda: _answers(http, web, f"{iid}.test", "/v1/models", "api-v1"))
    assert (await get_via(http, web, f"{iid}.test", "/v2/models"))[0] == 404
    assert backends[0].hits["/v1/models"] >= 1
    await router_enabled(http, traefik.api, name_of(iid))


async def test_several_servers_all_receive_traffic(
    ingresses: Ingresses, backends: list[Backend], traefik: EmbeddedTraefik, http: aiohttp.ClientSession
) -> None:
    for n in range(3):
        backends.append(await Backend(f"s{n}").start())
    iid = uid()
    await ingresses.upsert(record(iid, upstream={"servers": [{"url": b.url} for b in backends]}))
    web = traefik.url("web")
    await eventually(lambda: _answers(http, web, f"{iid}.test", "/", None))
    seen = Counter([(await get_via(http, web, f"{iid}.test"))[1] for _ in range(30)])
    assert set(seen) == {"s0", "s1", "s2"}, seen


async def test_twelve_servers_keep_their_order_and_all_serve(
    ingresses: Ingresses, backends: list[Backend], traefik: EmbeddedTraefik, http: aiohttp.ClientSession
) -> None:
    # More than 10 servers: indices must be zero-padded or Traefik sorts 10 before 2.
    for n in range(12):
        backends.append(await Backend(f"s{n}").start())
    iid = uid()
    await ingresses.upsert(record(iid, upstream={"servers": [{"url": b.url} for b in backends]}))
    web = traefik.url("web")
    await eventually(lambda: _answers(http, web, f"{iid}.test", "/", None))
    service = await traefik_object(http, traefik.api, "http/services", name_of(iid))
    assert service is not None
    urls = [s["url"] for s in service["loadBalancer"]["servers"]]
    assert urls == [b.url for b in backends]
    seen = Counter([(await get_via(http, web, f"{iid}.test"))[1] for _ in range(48)])
    assert len(seen) == 12, seen


async def test_canary_split_within_tolerance(
    ingresses: Ingresses, backends: list[Backend], traefik: EmbeddedTraefik, http: aiohttp.ClientSession
) -> None:
    main, canary = await Backend("main").start(), await Backend("canary").start()
    backends.extend([main, canary])
    iid = uid()
    await ingresses.upsert(
        record(iid, upstream={"servers": [{"url": main.url}]}, canary={"weight": 25, "upstream": {"servers": [{"url": canary.url}]}})
    )
    web = traefik.url("web")
    await eventually(lambda: _answers(http, web, f"{iid}.test", "/", None))
    await router_enabled(http, traefik.api, name_of(iid))
    answers = Counter([(await get_via(http, web, f"{iid}.test"))[1] for _ in range(200)])
    # Traefik's weighted round robin is deterministic: 25% of 200 = 50, allow scheduling jitter.
    assert 35 <= answers["canary"] <= 65, answers
    assert answers["main"] + answers["canary"] == 200


async def test_ip_allow_list_answers_403_outside_the_range(
    ingresses: Ingresses, backends: list[Backend], traefik: EmbeddedTraefik, http: aiohttp.ClientSession
) -> None:
    backends.append(await Backend("guarded").start())
    denied, allowed = uid(), uid()
    await ingresses.upsert(
        record(denied, allowed_client_ips=["10.0.0.0/8"], upstream={"servers": [{"url": backends[0].url}]}),
        record(allowed, allowed_client_ips=["127.0.0.0/8", "10.0.0.0/8"], upstream={"servers": [{"url": backends[0].url}]}),
    )
    web = traefik.url("web")
    await eventually(lambda: serves(http, web, f"{denied}.test", status=403))
    await eventually(lambda: _answers(http, web, f"{allowed}.test", "/", "guarded"))
    await router_enabled(http, traefik.api, name_of(denied))


async def test_tcp_route(ingresses: Ingresses, traefik: EmbeddedTraefik, http: aiohttp.ClientSession) -> None:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    iid = uid()
    try:
        await ingresses.upsert(
            record(iid, protocol="tcp", hosts=[], entrypoints=["tcp"], upstream={"servers": [{"url": f"tcp://127.0.0.1:{port}"}]})
        )
        await eventually(lambda: router_enabled(http, traefik.api, name_of(iid), "tcp/routers"))

        async def roundtrip() -> bool:
            reader, writer = await asyncio.open_connection("127.0.0.1", traefik.entrypoints["tcp"])
            writer.write(b"ping\n")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), 2)
            writer.close()
            return line == b"echo ping\n"

        assert await eventually(roundtrip)
    finally:
        server.close()


async def test_upstream_tls_verified_with_the_test_ca(
    ingresses: Ingresses, backends: list[Backend], traefik: EmbeddedTraefik, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    ca_pem, context = tls_backend_context(tmp_path, "model.internal")
    backend = await Backend("tls-backend", ssl_context=context).start()
    backends.append(backend)
    good, wrong_name, unknown_ca, skip = uid(), uid(), uid(), uid()
    up = {"servers": [{"url": backend.url}]}
    await ingresses.upsert(
        record(good, upstream=up, upstream_tls={"ca_pem": ca_pem, "server_name": "model.internal"}),
        record(wrong_name, upstream=up, upstream_tls={"ca_pem": ca_pem, "server_name": "other.internal"}),
        record(unknown_ca, upstream=up, upstream_tls={"server_name": "model.internal"}),
        record(skip, upstream=up, upstream_tls={"insecure_skip_verify": True}),
    )
    web = traefik.url("web")
    assert await eventually(lambda: _answers(http, web, f"{good}.test", "/", "tls-backend"))
    await router_enabled(http, traefik.api, name_of(good))
    # The CA is really checked: a name the certificate does not carry fails the handshake, and so
    # does a certificate no trusted CA signed, unless verification is skipped.
    assert await eventually(lambda: serves(http, web, f"{wrong_name}.test", status=500))
    assert await eventually(lambda: serves(http, web, f"{unknown_ca}.test", status=500))
    assert await eventually(lambda: serves(http, web, f"{skip}.test", body="tls-backend"))


async def _answers(http: aiohttp.ClientSession, web: str, host: str, path: str, body: str | None, **kwargs: Any) -> bool:
    status, text = await get_via(http, web, host, path, **kwargs)
    return status == 200 and (body is None or text == body)


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    line = await reader.readline()
    writer.write(b"echo " + line)
    await writer.drain()
    writer.close()


async def test_router_tls_true_serves_https_with_the_default_certificate(
    ingresses: Ingresses, backends: list[Backend], traefik: EmbeddedTraefik, http: aiohttp.ClientSession,
    etcd_client: EtcdClient,
) -> None:
    backends.append(await Backend("secure").start())
    iid = uid()
    await ingresses.upsert(record(iid, tls=True, upstream={"servers": [{"url": backends[0].url}]}))
    https = traefik.url("web").replace("http://", "https://")
    no_verify = ssl.create_default_context()
    no_verify.check_hostname, no_verify.verify_mode = False, ssl.CERT_NONE
    await eventually(lambda: _answers(http, https, f"{iid}.test", "/", "secure", ssl=no_verify))
    # The certificate Traefik presents is the default certificate the exporter wrote under the root.
    stored = await etcd_client.get(f"{ROOT}/tls/stores/default/defaultCertificate/certFile")
    assert stored is not None
    port = traefik.entrypoints["web"]
    presented = await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", port))
    assert x509.load_pem_x509_certificate(presented.encode()) == x509.load_pem_x509_certificate(stored.value.encode())
    # Without TLS on the router, plain HTTP on the same host is not routed to it.
    assert await serves(http, traefik.url("web"), f"{iid}.test", status=404)


async def test_a_middleware_from_the_file_provider_is_applied_after_the_exporters_own(
    ingresses: Ingresses, backends: list[Backend], traefik: EmbeddedTraefik, http: aiohttp.ClientSession
) -> None:
    backends.append(await Backend("decorated").start())
    iid = uid()
    await ingresses.upsert(record(iid, middlewares=["from-file@file"], allowed_client_ips=["127.0.0.0/8"],
                                  upstream={"servers": [{"url": backends[0].url}]}))
    await eventually(lambda: _header(http, traefik.url("web"), f"{iid}.test", "X-From-File", "yes"))
    router = await traefik_object(http, traefik.api, "http/routers", name_of(iid))
    assert router is not None and router["middlewares"][1:] == ["from-file@file"]
    assert router["middlewares"][0].startswith("shared-allow-") and router["middlewares"][0].endswith("@etcd")


async def test_allow_list_ip_strategy_depth_reads_x_forwarded_for(
    ingresses: Ingresses, backends: list[Backend], traefik: EmbeddedTraefik, http: aiohttp.ClientSession
) -> None:
    backends.append(await Backend("behind-lb").start())
    iid = uid()
    await ingresses.upsert(record(iid, allowed_client_ips=["10.1.2.3/32"], allowed_client_ips_strategy={"depth": 1},
                                  upstream={"servers": [{"url": backends[0].url}]}))
    web, host = traefik.url("web"), f"{iid}.test"
    await eventually(lambda: _answers(http, web, host, "/", "behind-lb", headers={"Host": host, "X-Forwarded-For": "10.1.2.3"}))
    assert await serves(http, web, host, status=403)  # the direct client (127.0.0.1) is not allowed
    status, _ = await get_via(http, web, host, headers={"Host": host, "X-Forwarded-For": "10.9.9.9"})
    assert status == 403


async def _header(http: aiohttp.ClientSession, web: str, host: str, name: str, value: str) -> bool:
    async with http.get(web, headers={"Host": host}) as resp:
        return resp.status == 200 and resp.headers.get(name) == value


async def _bytes_until_closed(port: int, source: str, ssl_context: ssl.SSLContext | None = None, sni: str | None = None) -> bytes:
    """What a client from `source` that speaks first receives before Traefik or the backend closes the connection."""
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, local_addr=(source, 0), ssl=ssl_context, server_hostname=sni if ssl_context else None
        )
    except (ConnectionError, ssl.SSLError):
        return b""
    try:
        # An HTTP/1.0 request: on a tcp-only entrypoint Traefik hands a connection no tcp router
        # matched to its HTTP handler, which answers it (404) and closes (docs/key-layout.md).
        writer.write(b"GET / HTTP/1.0\r\n\r\n")
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    except (ConnectionError, ssl.SSLError):
        return b""
    finally:
        writer.close()


async def test_a_tcp_allowlist_admits_only_its_clients(
    ingresses: Ingresses, traefik: EmbeddedTraefik, http: aiohttp.ClientSession
) -> None:
    backend = BannerServer()
    port = await backend.start()
    iid = uid()
    try:
        # A client from 127.0.0.1 is inside the list, one from 127.0.0.2 (loopback too) outside it.
        await ingresses.upsert(record(iid, protocol="tcp", hosts=[], entrypoints=["tcp"], allowed_client_ips=["127.0.0.1/32"],
                                      upstream={"servers": [{"url": f"tcp://127.0.0.1:{port}"}]}))
        await eventually(lambda: router_enabled(http, traefik.api, name_of(iid), "tcp/routers"))
        outside = await _bytes_until_closed(traefik.entrypoints["tcp"], "127.0.0.2")
        assert backend.banner not in outside, outside
        assert await _bytes_until_closed(traefik.entrypoints["tcp"], "127.0.0.1") == backend.banner
        # The outsider's connection was closed before Traefik dialled the backend: the one
        # connection the backend ever accepted is the insider's, made after it.
        assert backend.accepted == 1
    finally:
        backend.close()


async def test_a_tcp_allowlist_with_hosts_routes_tls_passthrough_by_sni_for_its_clients_only(
    ingresses: Ingresses, traefik: EmbeddedTraefik, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    iid = uid()
    ca_pem, context = tls_backend_context(tmp_path, f"{iid}.test")
    backend = BannerServer(context)
    port = await backend.start()
    client = ssl.create_default_context(cadata=ca_pem)
    try:
        await ingresses.upsert(record(iid, protocol="tcp", hosts=[f"{iid}.test", f"www.{iid}.test"], entrypoints=["tcp"],
                                      allowed_client_ips=["127.0.0.1/32", "10.0.0.0/8"],
                                      upstream={"servers": [{"url": f"tcp://127.0.0.1:{port}"}]}))
        await eventually(lambda: router_enabled(http, traefik.api, name_of(iid), "tcp/routers"))
        # TLS passes through Traefik: the backend's own certificate, verified by the client, under the SNI name.
        assert await _bytes_until_closed(traefik.entrypoints["tcp"], "127.0.0.1", client, f"{iid}.test") == backend.banner
        assert await _bytes_until_closed(traefik.entrypoints["tcp"], "127.0.0.2", client, f"{iid}.test") == b""
        assert backend.accepted == 1
    finally:
        backend.close()
