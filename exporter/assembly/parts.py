"""Every part of one daemon, built from the settings and wired in order: each part is built
after what it uses, so nothing is handed a half-built object."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..config import Settings
from ..control.events import EventRing
from ..control.status_view import StatusView
from ..etcd.client import EtcdClient
from ..health.checkers import load_kinds
from ..health.engine import HealthEngine
from ..health.kinds import BUILTIN
from ..health.notify import Notifier
from ..health.passive_monitor import PassiveMonitor
from ..health.sharding import Shards
from ..health.shared import SharedHealth
from ..keys import KeyLayout
from ..leader import Leadership, default_identity
from ..metrics import Metrics
from ..reconcile import Collaborators, Inbox, Reconciler
from ..render.ca_files import CaFiles
from ..render.edge import EdgePolicy
from ..render.renderer import Renderer
from ..roles import AllOf, AlwaysLeader
from ..sources.files import IngressFiles
from ..store.observed import Observed
from ..store.records import RecordStore
from ..supervisor import Supervisor
from ..tracing.hooks import Tracing
from ..tracing.setup import start_tracing
from ..traefik.observer import TraefikObserver
from ..traefik.serving import Serving
from . import factories
from .readiness import Readiness

if TYPE_CHECKING:
    from ..discovery import Discovery


@dataclass(frozen=True)
class Parts:
    """What a daemon runs; the optional parts are None when the settings leave them off."""

    settings: Settings
    layout: KeyLayout
    metrics: Metrics
    supervisor: Supervisor
    etcd: EtcdClient
    events: EventRing
    health: HealthEngine
    edge: EdgePolicy
    renderer: Renderer
    reconciler: Reconciler
    serving: Serving
    files: IngressFiles
    readiness: Readiness
    status: StatusView
    leadership: Leadership | None
    shared: SharedHealth | None
    shards: Shards | None
    notifier: Notifier | None
    observer: TraefikObserver | None
    passive: PassiveMonitor | None
    discovery: Discovery | None
    tracing: Tracing


def _read_at_scrape(metrics: Metrics, ca_files: CaFiles, readiness: Readiness) -> None:
    """The gauges read from the assembly's own parts: the CA files' states, and readiness (what /readyz answers)."""
    metrics.ca_file_ok.read_from(ca_files.states)
    metrics.ready.read_from(lambda: [((), 0.0 if readiness.reasons() else 1.0)])


def assemble(settings: Settings, dry_run: bool = False) -> Parts:
    """Build every part the settings describe (a dry run campaigns for nothing: it writes no election key)."""
    layout = settings.layout()
    metrics = Metrics()
    supervisor = Supervisor(metrics=metrics)
    # First: a setting it refuses (the extra missing) stops the daemon before anything starts.
    tracing = start_tracing(settings.otel, identity := default_identity())
    etcd = factories.etcd_client(settings)
    inbox, observed, store = Inbox(), Observed(layout), RecordStore()
    leadership, shared = _election(settings, etcd, layout, metrics, identity) if settings.leader.enabled and not dry_run else (None, None)
    notifier = factories.notifier(settings, leadership or AlwaysLeader(), store.ingress_of, metrics, tracing)
    events = EventRing(forward=notifier)
    if leadership is not None:
        leadership.add_listener(lambda leads: events.add("leadership", f"{identity} {'leads' if leads else 'no longer leads'}"))
    passive = factories.passive(settings, layout, metrics)
    health = HealthEngine(load_kinds(BUILTIN), inbox, concurrency=settings.health.concurrency, shared=shared,
                          rendered_urls=observed.server_urls, passive=passive, transitions=events, supervisor=supervisor,
                          metrics=metrics, tracing=tracing, identity=identity)
    shards = _shards(settings, etcd, layout, metrics, health, leadership)
    store.add_listener(health.update)
    edge = factories.edge_policy(settings)
    renderer = factories.renderer_for(settings, layout, edge)
    observer = factories.observer(settings, layout, observed, store, on_state=lambda root, state, _text: events.add(
        "traefik", f"{state} on {root}"), metrics=metrics, tracing=tracing)
    reconciler = factories.build_reconciler(
        settings, etcd, dry_run=dry_run, layout=layout, renderer=renderer,
        shared=Collaborators(
            store=store, observed=observed, inbox=inbox, leader=leadership or AlwaysLeader(),
            ejections=health, admission=AllOf(health, edge), supervisor=supervisor,
            behind=observer.behind if observer is not None else None, metrics=metrics, tracing=tracing,
        ),
    )
    if observer is not None:
        observer.add_listener(reconciler.traefik_checked)
    serving = Serving(
        layout, reconciler.ledger, lambda: reconciler.render_errors, observer, settings.api.served_timeout,
        pending=reconciler.keys_pending,
    )
    files = IngressFiles(settings.sources.files, reconciler, settings.sources.max_file_bytes)
    discovery = factories.discovery(settings, metrics)
    readiness = Readiness(etcd, reconciler, files, edge.ca_files, supervisor, leadership, observer, discovery)
    _read_at_scrape(metrics, edge.ca_files, readiness)
    return Parts(
        settings=settings, layout=layout, metrics=metrics, supervisor=supervisor, etcd=etcd, events=events, health=health, edge=edge,
        renderer=renderer, reconciler=reconciler, serving=serving, files=files, readiness=readiness,
        status=_status(etcd, reconciler, serving, observer, health, events, readiness, leadership, discovery),
        leadership=leadership, shared=shared, shards=shards, notifier=notifier, observer=observer,
        passive=factories.passive_monitor(settings, layout, passive, health, store.ingress_of, leadership),
        discovery=discovery, tracing=tracing,
    )


def _election(
    settings: Settings, etcd: EtcdClient, layout: KeyLayout, metrics: Metrics, identity: str
) -> tuple[Leadership, SharedHealth]:
    """The campaign for the root's election key, and the health states shared through it."""
    leadership = Leadership(etcd, layout.election_key, settings.leader.ttl, identity=identity, metrics=metrics)
    return leadership, SharedHealth(etcd, layout, leadership.identity, leadership)


def _shards(
    settings: Settings, etcd: EtcdClient, layout: KeyLayout, metrics: Metrics, health: HealthEngine, leadership: Leadership | None
) -> Shards | None:
    """With `health.sharding: on`, every sidecar probes its share, announced on its election lease."""
    if settings.health.sharding != "on" or leadership is None:
        return None
    shards = Shards(etcd, layout, leadership.identity, metrics)
    health.shard_with(shards)
    leadership.add_lease_listener(shards.lease_changed)
    return shards


def _status(
    etcd: EtcdClient, reconciler: Reconciler, serving: Serving, observer: TraefikObserver | None, health: HealthEngine,
    events: EventRing, readiness: Readiness, leadership: Leadership | None, discovery: Discovery | None,
) -> StatusView:
    return StatusView(
        version=__version__, reconciler=reconciler, serving=serving, observer=observer, health=health, events=events,
        readiness=readiness.reasons, role=lambda: _role(leadership), etcd_reachable=lambda: etcd.reachability().reachable,
        discovery=lambda: discovery.registered if discovery is not None else None,
    )


def _role(leadership: Leadership | None) -> dict[str, Any]:
    if leadership is None:
        return {"role": "leader (no election)", "leader": None}
    return {"role": "leader" if leadership.is_leader() else "follower", "leader": leadership.leader}
