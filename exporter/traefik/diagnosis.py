"""Why a root is not served: its convergence view, keys under it Traefik's decoder rejects, routers Traefik reports broken."""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from ..keys import IngressRef, KeyLayout
from ..store.observed import Observed
from ..store.records import RecordStore
from .decoder import decoder_problem

State = Literal["converged", "pending", "frozen", "unreachable"]

# Behind for this long (or half of max_lag, when shorter) before blocking keys are looked for.
_SCAN_AFTER = 1.0
_SCAN_EVERY = 1.0
# Apply times kept per root for the median `/v1/convergence` reports.
_APPLY_KEPT = 10


@dataclass
class RootConvergence:
    """What `/v1/convergence` reports for one root."""

    root: str
    state: State = "pending"
    committed_revision: int = 0
    applied_revision: int = 0
    lag_seconds: float = 0.0
    since: float = field(default_factory=time.time)
    blocking_keys: list[str] = field(default_factory=list)
    router_errors: list[dict[str, Any]] = field(default_factory=list)
    # Seconds from commit to Traefik serving it, of the last commits it applied (newest last).
    applies: deque[float] = field(default_factory=lambda: deque(maxlen=_APPLY_KEPT))

    def to_json(self) -> dict[str, Any]:
        """The JSON shape of `/v1/convergence` roots (`since` as RFC 3339, UTC)."""
        return {
            "root": self.root,
            "state": self.state,
            "committed_revision": self.committed_revision,
            "applied_revision": self.applied_revision,
            "lag_seconds": round(self.lag_seconds, 3),
            "since": datetime.fromtimestamp(self.since, UTC).isoformat(timespec="milliseconds"),
            "blocking_keys": self.blocking_keys,
            "router_errors": self.router_errors,
            "apply_seconds": {"last": round(self.applies[-1], 3), "median": round(statistics.median(self.applies), 3)}
            if self.applies else None,
        }


class Diagnosis:
    """Why a root is not served: keys Traefik's decoder rejects under it, and routers Traefik reports broken."""

    def __init__(self, layout: KeyLayout, observed: Observed, store: RecordStore, max_lag: float) -> None:
        self._layout = layout
        self._observed = observed
        self._store = store
        self._max_lag = max_lag
        self._last_scan = 0.0
        self.broken: list[dict[str, Any]] = []  # what Traefik's API last listed

    def rescan(self) -> None:
        """Scan at the next update, whatever the time since the last scan."""
        self._last_scan = 0.0

    def update(self, view: RootConvergence, now: float) -> None:
        """Set the root's blocking keys and router errors."""
        self._scan(view, now)
        view.router_errors = self._router_errors(view.root)

    def _scan(self, view: RootConvergence, now: float) -> None:
        # A full scan of the root's keys: only once Traefik has been behind for longer than an
        # ordinary reload takes (at a large root, three of its measured apply times), and then
        # at most once a second.
        ordinary = max(_SCAN_AFTER, 3 * statistics.median(view.applies)) if view.applies else _SCAN_AFTER
        if view.state == "converged" or view.lag_seconds < min(ordinary, self._max_lag / 2):
            view.blocking_keys = []
            return
        if now - self._last_scan < _SCAN_EVERY:
            return
        self._last_scan = now
        view.blocking_keys = blocking_keys(view.root, self._observed.under_root(view.root), self._layout, self._owned)

    def _owned(self, ref: IngressRef) -> bool:
        return ref in self._store.records

    def _router_errors(self, root: str) -> list[dict[str, Any]]:
        out = []
        for router in self.broken:
            name = str(router.get("name", "")).partition("@")[0]
            ref = self._layout.owner_of_object(name)
            if ref is not None and self._owned(ref) and self._layout.root(ref.authority) == root:
                out.append({"router": name, "status": router.get("status"), "errors": list(router.get("error") or [])})
        return sorted(out, key=lambda e: str(e["router"]))


def blocking_keys(
    root: str, keys: Mapping[str, tuple[str, int]], layout: KeyLayout, owned: Callable[[IngressRef], bool]
) -> list[str]:
    """Keys under `root` the exporter does not own and Traefik's decoder would reject, sorted."""
    out = []
    for key, (value, _mod) in keys.items():
        if layout.is_root_owned(root, key):
            continue
        ref = layout.owner_of_key(key)
        if ref is not None and owned(ref):
            continue
        if decoder_problem(root, key, value) is not None:
            out.append(key)
    return sorted(out)
