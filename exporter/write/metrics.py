"""Prometheus metrics of the write path."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

TXNS = Counter("exporter_etcd_txns_total", "etcd transactions sent by the writer", ["result"])
KEYS_WRITTEN = Counter("exporter_etcd_keys_written_total", "keys put or deleted by committed transactions")
ETCD_ERRORS = Counter("exporter_etcd_errors_total", "etcd requests that failed (unreachable or refused)")
PLAN_CHANGES = Histogram(
    "exporter_plan_changes", "key changes per applied plan", buckets=(0, 1, 10, 100, 1000, 10000, 100000)
)
RECONCILE_SECONDS = Histogram("exporter_reconcile_seconds", "duration of full reconcile passes")
REPAIRS = Counter("exporter_drift_repairs_total", "owned keys restored after someone else changed them")
