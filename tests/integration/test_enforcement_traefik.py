"""Fields whose effect no other test proved on the real Traefik (the rows of tests/enforcement.py that cite them)."""

from __future__ import annotations

import asyncio
import ssl
from collections import Counter

import aiohttp
import pytest

from exporter.daemon import Daemon
from exporter.embedded import EmbeddedTraefik
from exporter.etcd.client import EtcdClient
from tests.conftest import ROOT, Ingresses
from tests.helpers import AUTHORITY, Backend, BannerServer, eventually, get_via, record, router_enabled, serves, uid
from tests.integration.test_health import FAST, ing, push
from tests.integration.test_traefik_features import name_of

pytestmark = pytest.mark.integration


async def test_entrypoints_choose_where_an_http_router_listens(
    ingresses: Ingresses, backends: list[Backend], traefik: EmbeddedTraefik, http: aiohttp.ClientSession
) -> None:
    backends.append(await Backend("elsewhere").start())
    iid = uid()
    await ingresses.upsert(record(iid, entrypoints=["tcp"], upstream={"servers": [{"url": backends[0].url}]}))
    assert await eventually(lambda: serves(http, traefik.url("tcp"), f"{iid}.test", body="elsewhere"))
    assert await serves(http, traefik.url("web"), f"{iid}.test", status=404)


async def test_a_tcp_canary_splits_connections_between_its_groups(
    ingresses: Ingresses, traefik: EmbeddedTraefik, http: aiohttp.ClientSession
) -> None:
    main, canary = BannerServer(), BannerServer()
    main_port, canary_port = await main.start(), await canary.start()
    iid = uid()
    try:
        await ingresses.upsert(record(iid, protocol="tcp", hosts=[], entrypoints=["tcp"],
                                      upstream={"servers": [{"url": f"tcp://127.0.0.1:{main_port}"}]},
                                      canary={"weight": 25, "upstream": {"servers": [{"url": f"tcp://127.0.0.1:{canary_port}"}]}}))
        await eventually(lambda: router_enabled(http, traefik.api, name_of(iid), "tcp/routers"))
        seen: Counter[bytes] = Counter()
        for _ in range(40):
            reader, writer = await asyncio.open_connection("127.0.0.1", traefik.entrypoints["tcp"])
            seen[await asyncio.wait_for(reader.readline(), 10)] += 1
            writer.close()
        # Traefik's weighted round robin is deterministic: 25 % of 40 = 10.
        assert 5 <= seen[canary.banner] <= 15 and seen[main.banner] + seen[canary.banner] == 40, seen
    finally:
        main.close()
        canary.close()


async def test_tls_options_from_the_file_provider_set_the_handshake_rules(
    ingresses: Ingresses, backends: list[Backend], traefik: EmbeddedTraefik, http: aiohttp.ClientSession
) -> None:
    backends.append(await Backend("modern").start())
    iid = uid()
    await ingresses.upsert(record(iid, tls={"options": "tls13@file"}, upstream={"servers": [{"url": backends[0].url}]}))
    https = traefik.url("web").replace("http://", "https://")
    any_version = ssl.create_default_context()
    any_version.check_hostname, any_version.verify_mode = False, ssl.CERT_NONE
    assert await eventually(lambda: _answers(http, https, f"{iid}.test", "modern", any_version))
    tls12 = ssl.create_default_context()
    tls12.check_hostname, tls12.verify_mode = False, ssl.CERT_NONE
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises((aiohttp.ClientConnectorError, aiohttp.ClientOSError)):
        await get_via(http, https, f"{iid}.test", ssl=tls12, server_hostname=f"{iid}.test")


async def test_a_cert_resolver_is_asked_for_the_router_domains(
    ingresses: Ingresses, backends: list[Backend], traefik: EmbeddedTraefik, http: aiohttp.ClientSession
) -> None:
    backends.append(await Backend("acme").start())
    iid = uid()
    main, san = f"{iid}.test", f"www.{iid}.test"
    await ingresses.upsert(record(iid, tls={"cert_resolver": "le", "domains": [{"main": main, "sans": [san]}]},
                                  upstream={"servers": [{"url": backends[0].url}]}))
    await eventually(lambda: router_enabled(http, traefik.api, name_of(iid)))

    def asked() -> bool:
        # Traefik's ACME provider logs the domains it could not get a certificate for (its CA is not served here).
        return any("Unable to obtain ACME certificate" in line and main in line and san in line
                   for line in traefik.log.read_text(errors="replace").splitlines())

    assert await eventually(lambda: asyncio.to_thread(asked))


async def test_a_tcp_health_check_ejects_a_server_that_refuses_connections(
    api_daemon: Daemon, traefik: EmbeddedTraefik, http: aiohttp.ClientSession,
    etcd_client: EtcdClient,
) -> None:
    live = BannerServer()
    port = await live.start()
    dead = Backend("never-started")  # a free port nobody listens on
    iid = uid()
    try:
        upstream = {"servers": [{"url": f"tcp://127.0.0.1:{port}"}, {"url": f"tcp://127.0.0.1:{dead.port}"}]}
        await push(http, api_daemon, ing(iid, upstream, FAST, protocol="tcp", hosts=[], entrypoints=["tcp"]))

        async def only_the_live_server() -> bool:
            kvs = (await etcd_client.range_prefix(f"{ROOT}/tcp/services/{AUTHORITY}_{iid}/")).kvs
            return {kv.value for kv in kvs if kv.key.endswith("/address")} == {f"127.0.0.1:{port}"}

        assert await eventually(only_the_live_server)
        await eventually(lambda: router_enabled(http, traefik.api, name_of(iid), "tcp/routers"))
        for _ in range(6):
            reader, writer = await asyncio.open_connection("127.0.0.1", traefik.entrypoints["tcp"])
            assert await asyncio.wait_for(reader.readline(), 10) == live.banner
            writer.close()
    finally:
        await push(http, api_daemon, {"authority": AUTHORITY, "id": iid, "revision": 1}, path="remove")
        live.close()


async def _answers(http: aiohttp.ClientSession, url: str, host: str, body: str, context: ssl.SSLContext) -> bool:
    # TLS options are chosen by SNI: the request names the host in its handshake too.
    return await get_via(http, url, host, ssl=context, server_hostname=host) == (200, body)


async def test_excluded_ips_skip_the_load_balancers_in_x_forwarded_for(
    ingresses: Ingresses, backends: list[Backend], traefik: EmbeddedTraefik, http: aiohttp.ClientSession
) -> None:
    backends.append(await Backend("behind-lb").start())
    iid = uid()
    await ingresses.upsert(record(iid, allowed_client_ips=["10.1.2.3/32"], allowed_client_ips_strategy={"excluded_ips": ["192.168.0.0/16"]},
                                  upstream={"servers": [{"url": backends[0].url}]}))
    web, host = traefik.url("web"), f"{iid}.test"

    async def status(forwarded: str) -> int:
        return (await get_via(http, web, host, headers={"Host": host, "X-Forwarded-For": forwarded}))[0]

    # The client is the right-most address that is not a load balancer's.
    async def served() -> bool:
        return await status("10.1.2.3, 192.168.0.9") == 200

    assert await eventually(served)
    assert await status("10.9.9.9, 192.168.0.9") == 403
    assert await status("10.1.2.3, 192.168.0.9, 172.16.0.1") == 403

