"""The daemon: starts the parts `assemble` built, runs their tasks under supervision, stops them in order."""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web
from loguru import logger
from watchfiles import awatch

from .assembly import Parts, assemble
from .assembly.apps import control_server, push_api, server_tls
from .config import Settings
from .malformed import server_logger

# Seconds of silence from etcd after which it is asked (readiness sees an outage while idle).
_PROBE_EVERY = 1.0


async def _serve(app: web.Application, listen: str, tls: ssl.SSLContext | None, errors: logging.Logger) -> web.AppRunner:
    host, _, port = listen.rpartition(":")
    runner = web.AppRunner(app, access_log=None, logger=errors)
    await runner.setup()
    await web.TCPSite(runner, host, int(port), ssl_context=tls).start()
    return runner


class Daemon:
    """One exporter process: serves its control server and push API, runs every task of its parts."""

    def __init__(self, settings: Settings, dry_run: bool = False) -> None:
        self.settings = settings
        self.parts: Parts = assemble(settings, dry_run)
        if self.parts.leadership is not None:
            self.parts.leadership.add_listener(self._leadership_changed)
        self.stop_event = asyncio.Event()
        self._stopping = False
        self._electing = self._following_files = False
        self._runners: list[web.AppRunner] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Serve the control API, sync with etcd, then apply the sources and serve the push API."""
        parts = self.parts
        api_app = push_api(parts)
        control, api = self.settings.control, self.settings.api
        control_tls = server_tls(control.tls_cert_file, control.tls_key_file, "control")
        self._runners.append(await _serve(control_server(parts), control.listen, control_tls, server_logger("control server")))
        logger.info("control server on {}://{}", "https" if control_tls else "http", control.listen)
        if api_app is not None:
            api_tls = server_tls(api.tls_cert_file, api.tls_key_file, "api")
            errors = server_logger("push API", parts.metrics.api_requests)
            self._runners.append(await _serve(api_app, api.listen, api_tls, errors))
            logger.info("push API on {}://{}", "https" if api_tls else "http", api.listen)
        await parts.reconciler.start()
        # Silent for half a lease (at least 2 s): not ready, and pushes refused, before the lease is lost.
        silent_after = max(2.0, self.settings.leader.ttl / 2)
        self._spawn("etcd-probe", lambda: parts.etcd.probe_while_idle(_PROBE_EVERY, silent_after))
        if parts.observer is not None:
            self._spawn("traefik-observer", parts.observer.run)
        if parts.discovery is not None:
            self._spawn("discovery", parts.discovery.run)
        if (templates := self.settings.templates.dir) is not None:
            self._spawn("templates", lambda: self._watch_templates(templates))
        if (shared := parts.shared) is not None:
            # Followers' metrics follow the leader's states; the leader publishes its engine's documents.
            self._spawn("health-reader", lambda: shared.run_reader(self._shared_changed))
            self._spawn("health-publisher", lambda: shared.run_publisher(parts.health.document))
        if parts.shards is not None:
            self._spawn("health-shards", parts.shards.run)
        if parts.passive is not None:
            self._spawn("passive-health", parts.passive.run)
        if parts.notifier is not None:
            self._spawn("health-notifier", parts.notifier.run)
        if self.settings.upstream.ca_file_dirs:
            reconciler = parts.reconciler
            self._spawn("ca-files", lambda: parts.edge.ca_files.watch(
                reconciler.ca_files_in_use, reconciler.ca_file_changed, self.stop_event))
        self._spawn("startup", self._after_sync)

    def _spawn(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        self._tasks.append(self.parts.supervisor.spawn(name, run))

    def _shared_changed(self) -> None:
        # Followers restart runs of servers the leader ejected.
        if self.parts.passive is not None and self.parts.shared is not None:
            self.parts.passive.follow_leader(self.parts.shared.docs)

    def _leadership_changed(self, leader: bool) -> None:
        # Deciding health (and probing, without sharding), repair and the periodic reconcile follow leadership.
        if not self._stopping:
            self._spawn("lead" if leader else "follow", self._lead if leader else self.parts.health.step_down)

    async def _lead(self) -> None:
        # Probing starts from the published states before the first leader-only pass plans.
        await self.parts.health.start()
        self.parts.reconciler.request_full()

    async def _watch_templates(self, directory: Path) -> None:
        # A changed template applies to every ingress at once (one full pass). An ingress the
        # new template cannot render keeps its keys and is reported by /readyz.
        async for _changes in awatch(directory, stop_event=self.stop_event, debounce=200):
            self.parts.renderer.reload()
            logger.info("templates in {} changed: re-rendering every ingress", directory)
            self.parts.reconciler.request_full()

    async def _after_sync(self) -> None:
        # Once etcd is read: probing (or the election that starts it), then the ingress files.
        parts = self.parts
        await parts.reconciler.wait_synced()
        if parts.leadership is None:
            await parts.health.start()
        elif not self._electing:
            if parts.shards is not None:
                parts.health.start_probing()
            self._electing = True
            self._spawn("leadership", parts.leadership.run)
        if not self._following_files:
            self._following_files = True
            self._spawn("ingress-files", lambda: parts.files.run(parts.reconciler.store.by_authority, self.stop_event))

    async def stop(self) -> None:
        """Stop accepting work, finish the transaction in flight, hand leadership over, close everything."""
        parts = self.parts
        self._stopping = True
        self.stop_event.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if parts.discovery is not None:
            await parts.discovery.unregister()
        await parts.health.stop()
        if parts.leadership is not None:
            await parts.leadership.resign()
        await parts.reconciler.stop()
        for runner in self._runners:
            await runner.cleanup()
        await parts.etcd.close()
        # The spans still queued are exported before the process ends (a blocking flush: off the loop).
        await asyncio.to_thread(parts.tracing.shutdown)

    async def run_until_signal(self) -> None:
        """Run until SIGTERM or SIGINT."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        await self.start()
        await self.stop_event.wait()
        logger.info("shutting down")
        await self.stop()
