"""One part each, built from the settings: no part here knows the daemon."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import __version__
from ..config import Settings
from ..errors import ConfigError
from ..etcd.client import EtcdClient
from ..etcd.gateway import EtcdSecurity
from ..etcd.store import EtcdStore
from ..health.accesslog import LogFollower
from ..health.engine import HealthEngine
from ..health.notify import Notifier
from ..health.passive import PassiveHealth, PassivePolicy
from ..health.passive_monitor import PassiveMonitor
from ..health.reports import PassiveReports
from ..ingress import Ingress
from ..keys import IngressRef, KeyLayout
from ..leader import Leadership
from ..metrics import Metrics
from ..plan.planner import Planner
from ..reconcile import Cadence, Collaborators, Reconciler, TxnLimits
from ..render.ca_files import CaFiles
from ..render.edge import EdgePolicy, TimeoutDefaults
from ..render.renderer import Renderer
from ..render.root_keys import load_certificate
from ..roles import AlwaysLeader, LeaderPolicy
from ..store.observed import Observed
from ..store.records import RecordStore
from ..tracing.hooks import NO_TRACING, Tracing
from ..traefik.api import TraefikApi
from ..traefik.diagnosis import State
from ..traefik.observer import TraefikObserver

if TYPE_CHECKING:
    from ..discovery import Discovery


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
        password=settings.secret("etcd.password"),
    )
    return EtcdClient(e.endpoints, e.timeout, e.page_size, security, e.transport)


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


def observer(
    settings: Settings, layout: KeyLayout, observed: Observed, store: RecordStore,
    on_state: Callable[[str, State, str], None], metrics: Metrics, tracing: Tracing = NO_TRACING,
) -> TraefikObserver | None:
    """The observer of what Traefik serves (None without `traefik.api_url`)."""
    t = settings.traefik
    if t.api_url is None:
        return None
    api = TraefikApi(t.api_url, username=t.username, password=settings.secret("traefik.password"), metrics=metrics)
    tracing.expect_served()
    return TraefikObserver(
        api, layout, observed, store, max_lag=t.max_lag, poll_interval=t.poll_interval, on_state=on_state, metrics=metrics,
        tracing=tracing,
    )


def passive(settings: Settings, layout: KeyLayout, metrics: Metrics) -> PassiveHealth | None:
    """Passive health's policy and state (None without an access log)."""
    p = settings.health.passive
    if p.access_log is None:
        return None
    policy = PassivePolicy(
        max_failures=p.max_failures, failure_statuses=frozenset(p.failure_statuses), base_ejection_time=p.base_ejection_time,
        max_ejection_time=max(p.max_ejection_time, p.base_ejection_time), max_ejection_percent=p.max_ejection_percent,
    )
    return PassiveHealth(policy, layout, metrics=metrics)


def notifier(
    settings: Settings, leader: LeaderPolicy, ingress_of: Callable[[IngressRef], Ingress | None], metrics: Metrics,
    tracing: Tracing = NO_TRACING,
) -> Notifier | None:
    """The notifier of the coordinator (None without `health.notify_url`)."""
    if settings.health.notify_url is None:
        return None
    return Notifier(settings.health.notify_url, settings.secret("health.notify_token"), leader, ingress_of, metrics=metrics,
                    tracing=tracing)


def passive_monitor(
    settings: Settings, layout: KeyLayout, state: PassiveHealth | None, engine: HealthEngine,
    ingress_of: Callable[[IngressRef], Ingress | None], leadership: Leadership | None,
) -> PassiveMonitor | None:
    """What follows the access log and feeds passive health (None without passive health)."""
    if state is None:
        return None
    access_log = settings.health.passive.access_log
    # With an election, followers publish their runs under their campaign lease and the leader reads them.
    reports = PassiveReports(leadership.etcd, layout, leadership.identity, leadership.lease) if leadership else None
    return PassiveMonitor(
        state, engine, leadership or AlwaysLeader(), ingress_of=ingress_of,
        follower=LogFollower(access_log) if access_log else None, reports=reports,
    )


def discovery(settings: Settings, metrics: Metrics) -> Discovery | None:
    """Backend.AI service discovery (None without `discovery.redis_url`)."""
    d = settings.discovery
    if d.redis_url is None:
        return None
    # Loaded only when configured: the Redis client is 61 modules, 5 MB of a daemon's memory.
    from ..discovery import Discovery, registration_of

    heartbeat = d.heartbeat if d.heartbeat is not None else d.ttl / 3
    return Discovery(registration_of(settings, __version__), d.redis_url, password=settings.secret("discovery.password"),
                     ttl=d.ttl, heartbeat=heartbeat, metrics=metrics)
