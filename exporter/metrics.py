"""Every metric the exporter exports, on a registry each daemon owns.

Counters and histograms count events where they happen. Gauges that only restate a part's
state (leadership, convergence, paced ingresses, node states) are `Derived`: the part names a
reader once and the value is read at scrape, so no code path can forget to update it. Two
daemons in one process (tests, benchmarks) keep separate numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import get_args

from loguru import logger
from prometheus_client import CollectorRegistry, Counter, GCCollector, Histogram, PlatformCollector, ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .health.state import Outcome, State

# One gauge sample: its label values (in the gauge's label order) and its value.
Sample = tuple[Sequence[str], float]


class Derived(Collector):
    """A gauge whose samples are read at scrape from the part that owns the state."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str], registry: CollectorRegistry) -> None:
        self.name, self._doc, self._labels = name, documentation, list(labels)
        self._read: Callable[[], Iterable[Sample]] | None = None
        registry.register(self)

    def read_from(self, read: Callable[[], Iterable[Sample]]) -> None:
        """Name the reader of this gauge's samples (the owning part, once, when it is built)."""
        self._read = read

    def samples(self) -> dict[tuple[str, ...], float]:
        """The samples as read now, by label values (empty: no reader yet)."""
        return {tuple(labels): value for labels, value in self._read()} if self._read is not None else {}

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The family without samples (the registry learns its name from it)."""
        yield GaugeMetricFamily(self.name, self._doc, labels=self._labels)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The family with the samples read now; a reader that raises is logged and leaves it empty."""
        family = GaugeMetricFamily(self.name, self._doc, labels=self._labels)
        try:
            samples = self.samples()
        except Exception:  # noqa: BLE001 - one broken reader must not fail the whole scrape
            logger.exception("metrics: reading {} failed", self.name)
            samples = {}
        for labels, value in samples.items():
            family.add_metric(list(labels), value)
        yield family


# Why the mirror was listed again (docs/operations.md).
RELIST_REASONS = ("start", "recovered", "compacted", "out-of-order", "stalled", "conflict", "requested")


class Metrics:
    """The daemon's metrics; `registry` is what its /metrics page serves."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # What every Prometheus client exports (CPU, memory, file descriptors, GC, Python version):
        # the dashboard's process row and fleet-wide comparisons rely on the standard names.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        counter, gauge, histogram = self._counter, self._gauge, self._histogram
        # write path
        self.etcd_txns = counter("exporter_etcd_txns_total", "etcd transactions sent by the writer", "result")
        self.keys_written = counter("exporter_etcd_keys_written_total", "keys put or deleted by committed transactions")
        self.etcd_errors = counter("exporter_etcd_errors_total", "etcd requests that failed (unreachable or refused)")
        self.plan_changes = histogram("exporter_plan_changes", "key changes per applied plan", (0, 1, 10, 100, 1000, 10000, 100000))
        self.reconcile_seconds = histogram("exporter_reconcile_seconds", "duration of full reconcile passes", Histogram.DEFAULT_BUCKETS)
        self.drift_repairs = counter("exporter_drift_repairs_total", "owned keys restored after someone else changed them")
        self.paced_ingresses = gauge(
            "exporter_writer_paced_ingresses", "ingresses whose keys wait for Traefik to apply the previous commit", "root"
        )
        # the mirror
        self.mirror_revision = gauge("exporter_mirror_revision", "the etcd revision the mirror (what plans diff against) is a copy of")
        self.mirror_relists = counter("exporter_mirror_relists_total", "listings of etcd that replaced the mirror, by reason", "reason")
        # Traefik
        self.traefik_converged = gauge("exporter_traefik_converged", "1 when Traefik has applied every commit under the root", "root")
        self.traefik_applied_revision = gauge(
            "exporter_traefik_applied_revision", "newest etcd revision whose keys Traefik has applied", "root"
        )
        self.traefik_lag = gauge("exporter_traefik_lag_seconds", "how long Traefik has been behind etcd (0 when converged)", "root")
        self.traefik_blocking_keys = gauge("exporter_traefik_blocking_keys", "keys under the root Traefik's decoder would reject", "root")
        self.traefik_apply = histogram(
            "exporter_traefik_apply_seconds", "from a commit under the root to Traefik serving it (its beacon shown)",
            (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120), "root",
        )
        self.traefik_requests = counter("exporter_traefik_requests_total", "requests to Traefik's API by the observer", "what")
        self._health()
        self._daemon()
        self._zeros()

    def _zeros(self) -> None:
        """Every known label value of a counter exists at 0 from the start: increase() and rate()
        over a series that first appears at 1 read 0, so the first event would be invisible."""
        for result in ("committed", "conflict"):
            self.etcd_txns.labels(result)
        for reason in RELIST_REASONS:
            self.mirror_relists.labels(reason)
        for outcome in get_args(Outcome):
            self.health_probes.labels(outcome)
        for state in State:
            self.health_transitions.labels(state.value)

    def _health(self) -> None:
        counter, gauge, histogram = self._counter, self._gauge, self._histogram
        self.health_nodes = gauge("exporter_health_nodes", "checked nodes by state", "state")
        self.health_probes = counter("exporter_health_probes_total", "health probes by result", "result")
        self.plugin_errors = counter(
            "exporter_health_plugin_errors_total", "checker plugin probes that raised (counted as failures)", "plugin"
        )
        self.health_transitions = counter("exporter_health_transitions_total", "node routing changes", "to")
        self.schedule_lag = histogram(
            "exporter_health_schedule_lag_seconds", "how late probes start against their schedule",
            (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
        )
        self.passive_failures = counter(
            "exporter_health_passive_failures_total", "failed requests to a server seen in this sidecar's access log"
        )
        self.passive_ejections = counter("exporter_health_passive_ejections_total", "servers ejected by passive health")
        self.shard_targets = gauge(
            "exporter_health_shard_targets", "checked servers each live sidecar probes (health.sharding on)", "sidecar"
        )
        self.probed_by_several = gauge(
            "exporter_health_probed_by_several", "checked servers more than one sidecar probes, by the views they announced (0 settled)"
        )
        self.notifications = counter("exporter_health_notifications_total", "node transitions delivered to health.notify_url")
        self.notification_failures = counter("exporter_health_notification_failures_total", "requests to health.notify_url that got no 2xx")
        self.notifications_pending = gauge("exporter_health_notifications_pending", "node transitions waiting to be delivered")
        self.ca_file_ok = gauge(
            "exporter_upstream_ca_file_ok", "1 while an upstream CA file holds valid PEM certificates, 0 when it does not", "path"
        )

    def _daemon(self) -> None:
        counter, gauge = self._counter, self._gauge
        self.api_requests = counter("exporter_api_requests_total", "push API requests by route and status", "route", "status")
        self.leader = gauge("exporter_leader", "1 while this exporter is the leader")
        self.ready = gauge("exporter_ready", "1 while the daemon is ready (what /readyz answers 200 for), else 0")
        self.discovery_registered = gauge("exporter_discovery_registered", "1 while the registration in service discovery is current")
        self.discovery_errors = counter("exporter_discovery_errors_total", "failed writes to the service-discovery Redis")
        self.task_restarts = counter("exporter_task_restarts_total", "long-running tasks restarted after a crash", "task")

    def _counter(self, name: str, documentation: str, *labels: str) -> Counter:
        return Counter(name, documentation, labels, registry=self.registry)

    def _histogram(self, name: str, documentation: str, buckets: Sequence[float], *labels: str) -> Histogram:
        return Histogram(name, documentation, labels, buckets=buckets, registry=self.registry)

    def _gauge(self, name: str, documentation: str, *labels: str) -> Derived:
        return Derived(name, documentation, labels, self.registry)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """One sample as the registry would serve it now (0.0: no such sample)."""
        found = self.registry.get_sample_value(name, labels or {})
        return 0.0 if found is None else found
