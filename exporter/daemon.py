"""The daemon: builds every part from the settings, owns startup and graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web
from loguru import logger
from watchfiles import awatch

from . import __version__
from .config import Settings
from .control.access import security_headers, token_required
from .control.convergence import convergence_routes
from .control.events import EventRing, events_routes
from .control.healthcheck import healthcheck_routes
from .control.server import control_app
from .control.status_page import StatusPages
from .control.status_view import StatusView
from .errors import ConfigError, EtcdError
from .etcd.client import EtcdClient
from .etcd.gateway import EtcdSecurity
from .etcd.store import EtcdStore
from .health.accesslog import LogFollower
from .health.checkers import load_kinds
from .health.engine import HealthEngine
from .health.kinds import BUILTIN
from .health.notify import Notifier
from .health.passive import PassiveHealth, PassivePolicy
from .health.passive_monitor import PassiveMonitor
from .health.reports import PassiveReports
from .health.shared import SharedHealth
from .ingress import Ingress
from .keys import IngressRef, KeyLayout
from .leader import Leadership
from .plan.planner import Planner
from .reconcile import Cadence, Collaborators, Inbox, Reconciler, TxnLimits
from .render.ca_files import CaFiles
from .render.edge import EdgePolicy, TimeoutDefaults
from .render.renderer import Renderer
from .render.root_keys import load_certificate
from .roles import AllOf, AlwaysLeader, LeaderPolicy
from .sources.api import is_loopback, push_api_app
from .sources.files import IngressFiles
from .store.observed import Observed
from .store.records import RecordStore
from .supervisor import Supervisor
from .traefik.api import TraefikApi
from .traefik.observer import TraefikObserver
from .traefik.serving import Serving

if TYPE_CHECKING:
    from .discovery import Discovery

# Seconds of silence from etcd after which it is asked (readiness sees an outage while idle).
_PROBE_EVERY = 1.0


def etcd_client(settings: Settings) -> EtcdClient:
    """The etcd client the settings describe (endpoints, TLS, auth)."""
    e = settings.etcd
    for name in ("ca_file", "cert_file", "key_file"):
        path = getattr(e, name)
        if path is not None and not path.is_file():
            raise ConfigError(f"etcd.{name}: {path} does not exist")
    security = EtcdSecurity(
        ca_file=str(e.ca_file) if e.ca_file else None,
        cert_file=str(e.cert_file) if e.cert_file else None,
        key_file=str(e.key_file) if e.key_file else None,
        server_name=e.server_name,
        username=e.username,
        password=settings.etcd_password(),
    )
    return EtcdClient(e.endpoints, e.timeout, e.page_size, security)


def edge_policy(settings: Settings) -> EdgePolicy:
    """What the edge fields of ingresses render and are checked with: default timeouts, their bounds, CA files."""
    u = settings.upstream
    defaults = TimeoutDefaults(u.timeouts.dial, u.timeouts.response_header, u.timeouts.idle)
    return EdgePolicy(defaults, (u.timeouts_bounds.min, u.timeouts_bounds.max), CaFiles(u.ca_file_dirs))


def renderer_for(settings: Settings, layout: KeyLayout, edge: EdgePolicy | None = None) -> Renderer:
    """The renderer the settings describe (the daemon, `diff` and `render` render alike)."""
    return Renderer(layout, settings.default_entrypoints, settings.templates.dir, edge or edge_policy(settings))


def build_reconciler(
    settings: Settings,
    etcd: EtcdStore,
    *,
    dry_run: bool = False,
    layout: KeyLayout | None = None,
    renderer: Renderer | None = None,
    shared: Collaborators = Collaborators(),
) -> Reconciler:
    """The reconciler the settings describe, built with the collaborators it shares (each defaults to a lone daemon's).

    Give the `layout` every other part uses: object labels of free-text authorities are
    resolved through the one layout that met them.
    """
    layout = layout or settings.layout()
    renderer = renderer or renderer_for(settings, layout)
    planner = Planner(renderer, layout, load_certificate(settings.tls.cert_file, settings.tls.key_file))
    w = settings.writer
    return Reconciler(
        etcd=etcd,
        layout=layout,
        planner=planner,
        cadence=Cadence(w.coalesce_window, w.reconcile_interval, w.tombstone_ttl, w.pace_hold_max),
        limits=TxnLimits(settings.etcd.max_txn_ops, settings.etcd.max_request_bytes, w.max_in_flight),
        dry_run=dry_run,
        shared=shared,
    )


def _server_tls(cert_file: Path | None, key_file: Path | None, section: str) -> ssl.SSLContext | None:
    if cert_file is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(str(cert_file), str(key_file) if key_file else None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{section}.tls_cert_file/tls_key_file: cannot load {cert_file}: {exc}") from None
    return context


async def _serve(app: web.Application, listen: str, tls: ssl.SSLContext | None = None) -> web.AppRunner:
    host, _, port = listen.rpartition(":")
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, int(port), ssl_context=tls).start()
    return runner


def _observer(settings: Settings, layout: KeyLayout, observed: Observed, store: RecordStore) -> TraefikObserver | None:
    t = settings.traefik
    if t.api_url is None:
        return None
    api = TraefikApi(t.api_url, username=t.username, password=settings.traefik_password())
    return TraefikObserver(api, layout, observed, store, max_lag=t.max_lag, poll_interval=t.poll_interval)


def _passive(settings: Settings, layout: KeyLayout) -> PassiveHealth | None:
    p = settings.health.passive
    if p.access_log is None:
        return None
    policy = PassivePolicy(
        max_failures=p.max_failures, failure_statuses=frozenset(p.failure_statuses), base_ejection_time=p.base_ejection_time,
        max_ejection_time=max(p.max_ejection_time, p.base_ejection_time), max_ejection_percent=p.max_ejection_percent,
    )
    return PassiveHealth(policy, layout)


def _notifier(settings: Settings, leader: LeaderPolicy, ingress_of: Callable[[IngressRef], Ingress | None]) -> Notifier | None:
    if settings.health.notify_url is None:
        return None
    return Notifier(settings.health.notify_url, settings.notify_token(), leader, ingress_of)


def _passive_monitor(
    settings: Settings, layout: KeyLayout, passive: PassiveHealth | None, engine: HealthEngine,
    ingress_of: Callable[[IngressRef], Ingress | None], leadership: Leadership | None,
) -> PassiveMonitor | None:
    if passive is None:
        return None
    access_log = settings.health.passive.access_log
    # With an election, followers publish their runs under their campaign lease and the leader reads them.
    reports = PassiveReports(leadership.etcd, layout, leadership.identity, leadership.lease) if leadership else None
    return PassiveMonitor(
        passive, engine, leadership or AlwaysLeader(), ingress_of=ingress_of,
        follower=LogFollower(access_log) if access_log else None, reports=reports,
    )


def _discovery(settings: Settings) -> Discovery | None:
    d = settings.discovery
    if d.redis_url is None:
        return None
    # Loaded only when configured: the Redis client is 61 modules, 5 MB of a daemon's memory.
    from .discovery import Discovery, registration_of

    heartbeat = d.heartbeat if d.heartbeat is not None else d.ttl / 3
    return Discovery(registration_of(settings, __version__), d.redis_url, password=settings.discovery_password(),
                     ttl=d.ttl, heartbeat=heartbeat)


def _status_view(daemon: Daemon) -> StatusView:
    def role() -> dict[str, Any]:
        if daemon.leadership is None:
            return {"role": "leader (no election)", "leader": None}
        return {"role": "leader" if daemon.leadership.is_leader() else "follower", "leader": daemon.leadership.leader}

    return StatusView(
        version=__version__, reconciler=daemon.reconciler, serving=daemon.serving, observer=daemon.observer,
        health=daemon.health, events=daemon.events, readiness=daemon.readiness, role=role,
        etcd_reachable=lambda: daemon.etcd.reachability().reachable,
        discovery=lambda: daemon.discovery.registered if daemon.discovery is not None else None,
    )


def _push_api(daemon: Daemon) -> web.Application | None:
    """The push API of `daemon` (None when disabled); refuses to serve it without a token beyond loopback."""
    api = daemon.settings.api
    if not api.enabled:
        return None
    token, jwt_secret = daemon.settings.api_token(), daemon.settings.api_jwt_secret()
    if token is None and jwt_secret is None:
        if not (api.allow_unauthenticated_loopback and is_loopback(api.listen)):
            raise ConfigError(
                "api: no token configured (api.token_file or EXPORTER_API__TOKEN); to serve the push API "
                "without one, set api.allow_unauthenticated_loopback and a loopback api.listen, "
                "or set api.enabled false"
            )
        logger.warning("push API on {} accepts requests without a token (loopback only)", api.listen)
    return push_api_app(
        daemon.reconciler, token=token, jwt_secret=jwt_secret, max_body_bytes=api.max_body_bytes,
        ready=daemon.accepting, serving=daemon.serving, refused=daemon.events.refused,
    )


def _control_server(daemon: Daemon) -> web.Application:
    """The control server's application: monitoring, health, convergence, events and the status page."""
    routes = healthcheck_routes(
        daemon.health, lambda owner: daemon.reconciler.store.get(owner) is not None, daemon.health_headers
    ) + convergence_routes(daemon.observer, daemon.reconciler.overlapping_roots, daemon.reconciler.pacer.backlog)
    routes += events_routes(daemon.events) + StatusPages(daemon.status).routes()
    settings = daemon.settings
    middlewares = [security_headers()]
    if not is_loopback(settings.control.listen):
        # Beyond loopback the page and its JSON ask for the push API's credentials (monitoring paths stay open).
        required, login = token_required(settings.api_token(), settings.api_jwt_secret(), settings.control.open_paths)
        middlewares.append(required)
        routes += login
    return control_app(daemon.readiness, routes, middlewares)


class Daemon:
    """One exporter process: reconciler, health engine, leadership, sources, control server."""

    def __init__(self, settings: Settings, dry_run: bool = False) -> None:
        self.settings = settings
        self.supervisor = Supervisor()
        layout = settings.layout()
        self.etcd = etcd_client(settings)
        inbox = Inbox()
        observed = Observed(layout)
        self.leadership: Leadership | None = None
        self.shared: SharedHealth | None = None
        if settings.leader.enabled and not dry_run:  # a dry run writes nothing, not even an election key
            self.leadership = Leadership(
                self.etcd, layout.election_key, settings.leader.ttl, on_change=self._leadership_changed
            )
            self.shared = SharedHealth(self.etcd, layout, self.leadership.identity, self.leadership)
        self.notifier = _notifier(settings, self.leadership or AlwaysLeader(), self._ingress)
        self.events = EventRing(forward=self.notifier)
        passive = _passive(settings, layout)
        self.health = HealthEngine(
            load_kinds(BUILTIN), inbox, concurrency=settings.health.concurrency, shared=self.shared,
            rendered_urls=observed.server_urls, passive=passive, transitions=self.events, supervisor=self.supervisor,
        )
        self.edge = edge_policy(settings)
        self.renderer = renderer_for(settings, layout, self.edge)
        store = RecordStore(self.health.update)
        self.observer = _observer(settings, layout, observed, store)
        self.reconciler = build_reconciler(
            settings, self.etcd, dry_run=dry_run, layout=layout, renderer=self.renderer,
            shared=Collaborators(
                store=store, observed=observed, inbox=inbox, leader=self.leadership or AlwaysLeader(),
                ejections=self.health, admission=AllOf(self.health, self.edge), supervisor=self.supervisor,
                behind=self.observer.behind if self.observer is not None else None,
            ),
        )
        if self.observer is not None:
            self.observer.add_listener(self.reconciler.traefik_checked)
            self.observer.state_changed = lambda root, state, _text: self.events.add("traefik", f"{state} on {root}")
        self.passive = _passive_monitor(settings, layout, passive, self.health, self._ingress, self.leadership)
        self.serving = Serving(
            layout, self.reconciler.ledger, lambda: self.reconciler.render_errors, self.observer, settings.api.served_timeout,
            pending=self.reconciler.keys_pending,
        )
        self.files = IngressFiles(settings.sources.files, self.reconciler, settings.sources.max_file_bytes)
        self.discovery = _discovery(settings)
        self.status = _status_view(self)
        self.stop_event = asyncio.Event()
        self.sources_applied = False
        self._stopping = False
        self._electing = self._following_files = False
        self._runners: list[web.AppRunner] = []
        self._tasks: list[asyncio.Task[None]] = []

    def _ingress(self, owner: IngressRef) -> Ingress | None:
        record = self.reconciler.store.get(owner)
        return record.ingress if record is not None else None

    def _shared_changed(self) -> None:
        # Followers count the leader's states in their metrics and restart runs of servers it ejected.
        self.health.count_states()
        if self.passive is not None and self.shared is not None:
            self.passive.follow_leader(self.shared.docs)

    def readiness(self) -> list[str]:
        """Why the daemon is not ready; empty when it is."""
        status = self.reconciler.status
        reasons = []
        reach = self.etcd.reachability()
        if reach.reachable is False:
            reasons.append(f"etcd unreachable: {reach.error}")
        elif not status.etcd_ok:
            reasons.append(f"etcd unreachable: {status.last_error or 'not contacted yet'}")
        if not status.synced:
            reasons.append("first sync with etcd not done")
        elif self.leadership is not None and not self.leadership.is_leader() and self.leadership.leader is None:
            reasons.append("no leader elected")
        elif not self.sources_applied:
            reasons.append("ingress files not applied yet")
        reasons += [f"ingress file {path}: {error}" for path, error in sorted(self.files.errors.items())]
        reasons += [f"ingress {ref}: {error.title}" for ref, error in sorted(self.reconciler.render_errors.items())]
        if self.observer is not None:
            reasons += self.observer.readiness()
        if self.discovery is not None:
            reasons += self.discovery.readiness()
        return reasons + self.edge.ca_files.problems() + self.supervisor.readiness()

    def accepting(self) -> bool:
        """True when pushes can be taken: synced with etcd, and etcd answers."""
        status = self.reconciler.status
        return status.synced and status.etcd_ok and self.etcd.reachability().reachable is not False

    async def start(self) -> None:
        """Serve the control API, sync with etcd, then apply the sources and serve the push API."""
        push_api = _push_api(self)
        control, api = self.settings.control, self.settings.api
        control_tls = _server_tls(control.tls_cert_file, control.tls_key_file, "control")
        self._runners.append(await _serve(_control_server(self), control.listen, control_tls))
        logger.info("control server on {}://{}", "https" if control_tls else "http", control.listen)
        if push_api is not None:
            api_tls = _server_tls(api.tls_cert_file, api.tls_key_file, "api")
            self._runners.append(await _serve(push_api, api.listen, api_tls))
            logger.info("push API on {}://{}", "https" if api_tls else "http", api.listen)
        await self.reconciler.start()
        self._spawn("etcd-probe", self._probe_etcd)
        if self.observer is not None:
            self._spawn("traefik-observer", self.observer.run)
        if self.discovery is not None:
            self._spawn("discovery", self.discovery.run)
        if (templates := self.settings.templates.dir) is not None:
            self._spawn("templates", lambda: self._watch_templates(templates))
        if (shared := self.shared) is not None:
            # Followers' metrics follow the leader's states; the leader publishes its engine's documents.
            self._spawn("health-reader", lambda: shared.run_reader(self._shared_changed))
            self._spawn("health-publisher", lambda: shared.run_publisher(self.health.document))
        if self.passive is not None:
            self._spawn("passive-health", self.passive.run)
        if self.notifier is not None:
            self._spawn("health-notifier", self.notifier.run)
        if self.settings.upstream.ca_file_dirs:
            self._spawn("ca-files", lambda: self.edge.ca_files.watch(self._ca_files_in_use, self._ca_file_changed, self.stop_event))
        self._spawn("startup", self._after_sync)

    def _spawn(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        self._tasks.append(self.supervisor.spawn(name, run))

    async def _probe_etcd(self) -> None:
        # Readiness must see an etcd outage also while nothing is written: ask when etcd has been quiet.
        while True:
            await asyncio.sleep(_PROBE_EVERY / 2)
            if self.etcd.idle_for() >= _PROBE_EVERY:
                with contextlib.suppress(EtcdError):
                    await self.etcd.revision()

    def _ca_files_in_use(self) -> set[str]:
        return {path for record in self.reconciler.store.records.values() if (path := record.ingress.ca_file)}

    def _ca_file_changed(self, path: str) -> None:
        # A rotated CA: every transport that names the file is rewritten (through the guarded write path).
        refs = [ref for ref, record in self.reconciler.store.records.items() if record.ingress.ca_file == path]
        logger.info("upstream CA file {} changed: rewriting the transports of {} ingresses", path, len(refs))
        self.reconciler.mark_dirty(refs, "ca-file")

    def health_headers(self) -> dict[str, str]:
        # Which exporter's probes the answer reflects, and how old its newest document is.
        if self.leadership is None:
            return {}
        if self.leadership.is_leader():
            return {"X-Health-Leader": self.leadership.identity, "X-Health-Age": "0"}
        leader, age = self.shared.leader_and_age() if self.shared else (None, None)
        return {"X-Health-Leader": leader or "", "X-Health-Age": "" if age is None else f"{age:.1f}"}

    def _leadership_changed(self, leader: bool) -> None:
        # Probing, repair and the periodic reconcile follow leadership.
        if self.leadership is not None:
            self.events.add("leadership", f"{self.leadership.identity} {'leads' if leader else 'no longer leads'}")
        if self._stopping:
            return
        self._spawn("lead" if leader else "follow", self._lead if leader else self.health.stop)

    async def _lead(self) -> None:
        # Probing starts from the published states before the first leader-only pass plans.
        await self.health.start()
        self.reconciler.request_full()

    async def _watch_templates(self, directory: Path) -> None:
        # A changed template applies to every ingress at once (one full pass). An ingress the
        # new template cannot render keeps its keys and is reported by /readyz.
        async for _changes in awatch(directory, stop_event=self.stop_event, debounce=200):
            self.renderer.reload()
            logger.info("templates in {} changed: re-rendering every ingress", directory)
            self.reconciler.request_full()

    async def _after_sync(self) -> None:
        # Once etcd is read: probing (or the election that starts it), then the ingress files.
        await self.reconciler.wait_synced()
        if self.leadership is None:
            await self.health.start()
        elif not self._electing:
            self._electing = True
            self._spawn("leadership", self.leadership.run)
        if not self._following_files:
            self._following_files = True
            self._spawn("ingress-files", self._ingress_files)

    async def _ingress_files(self) -> None:
        self.files.adopt(self.reconciler.store.by_authority())
        await self.files.sync_all()
        self.sources_applied = True
        await self.files.follow(self.stop_event)

    async def stop(self) -> None:
        """Stop accepting work, finish the transaction in flight, hand leadership over, close everything."""
        self._stopping = True
        self.stop_event.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.discovery is not None:
            await self.discovery.unregister()
        await self.health.stop()
        if self.leadership is not None:
            await self.leadership.resign()
        await self.reconciler.stop()
        for runner in self._runners:
            await runner.cleanup()
        await self.etcd.close()

    async def run_until_signal(self) -> None:
        """Run until SIGTERM or SIGINT."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        await self.start()
        await self.stop_event.wait()
        logger.info("shutting down")
        await self.stop()

