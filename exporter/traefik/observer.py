"""The Traefik observer: for each root this daemon writes, has the Traefik next to it applied every commit?

Exactly, not by timing: every exporter transaction rewrites its root's beacon with a new
token, and Traefik decodes a root all or nothing, so the beacon Traefik shows names the
newest commit whose keys it has applied. Cheaply: one small request per check whatever the
number of ingresses (every `traefik.poll_interval` while converged, every 50 ms while behind
or while a request waits to be served), plus one page of broken routers per interval.

States per root: `converged`, `pending` (behind for at most `max_lag`), `frozen` (behind for
longer while Traefik answers: its provider is stuck, usually on a key it cannot decode),
`unreachable` (Traefik's API does not answer). A Traefik reads one root: once its beacon
names a root, only that root is reported.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from loguru import logger
from prometheus_client import Histogram

from ..errors import NotServedInTime, TraefikUnreachable
from ..keys import IngressRef, KeyLayout
from ..metrics import Metrics, Sample
from ..store.beacons import BeaconWrite
from ..store.observed import Observed
from ..store.records import RecordStore
from ..tracing.hooks import NO_TRACING, Tracing
from .api import TraefikApi
from .diagnosis import Diagnosis, RootConvergence, State

_FAST = 0.05
# While a request waits to be served: checks this often (a bounded 100 requests/s at most).
_WAITED = 0.01


class Checks:
    """Who hears of every check of Traefik: listeners called after it, and waiters woken by it."""

    def __init__(self) -> None:
        self._checked = asyncio.Condition()
        self.waiters = 0
        self._listeners: list[Callable[[], None]] = []

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener` after every check."""
        self._listeners.append(listener)

    async def done(self) -> None:
        """A check is done: tell the listeners, wake the waiters."""
        for listener in self._listeners:
            listener()
        async with self._checked:
            self._checked.notify_all()

    async def wait_until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Check `done` after every check; False after `timeout` s."""
        self.waiters += 1
        try:
            async with self._checked:
                await asyncio.wait_for(self._checked.wait_for(done), timeout)
        except TimeoutError:
            return False
        finally:
            self.waiters -= 1
        return True


class TraefikObserver:
    """Follows one Traefik through its API; `roots()`, `served()`, `wait_served()` and `readiness()` report it."""

    def __init__(
        self, api: TraefikApi, layout: KeyLayout, observed: Observed, store: RecordStore, *,
        max_lag: float = 30.0, poll_interval: float = 1.0, on_state: Callable[[str, State, str], None] | None = None,
        metrics: Metrics | None = None, tracing: Tracing = NO_TRACING,
    ) -> None:
        """`on_state` is told of every change of a root's state: (root, new state, a sentence); `tracing`, of what is served."""
        self.api = api
        self._tracing, self._every = tracing, poll_interval  # how often Traefik is checked now: how late a check may see a change
        self._layout = layout
        self._observed = observed
        self._store = store
        self._max_lag = max_lag
        self._poll_interval = poll_interval
        self._views: dict[str, RootConvergence] = {}
        self._served_root: str | None = None
        self._shown: str | None = None
        self._unreachable_since: float | None = None
        self._last_poll = self._last_routers = 0.0
        self._checks = Checks()
        self._diagnosis = Diagnosis(layout, observed, store, max_lag)
        self._on_state = on_state
        metrics = metrics or Metrics()
        self._apply = metrics.traefik_apply
        metrics.traefik_converged.read_from(lambda: self._per_root(lambda v: 1.0 if v.state == "converged" else 0.0))
        metrics.traefik_applied_revision.read_from(lambda: self._per_root(lambda v: float(v.applied_revision)))
        metrics.traefik_lag.read_from(lambda: self._per_root(lambda v: v.lag_seconds))
        metrics.traefik_blocking_keys.read_from(lambda: self._per_root(lambda v: float(len(v.blocking_keys))))

    def _per_root(self, value: Callable[[RootConvergence], float]) -> list[Sample]:
        return [((root,), value(view)) for root, view in sorted(self._views.items())]

    # ----- the loop

    async def run(self) -> None:
        """Check Traefik whenever it is due, until cancelled."""
        try:
            while True:
                now = time.monotonic()
                every = _WAITED if self._checks.waiters else _FAST if self._behind() else self._poll_interval
                if now - self._last_poll >= every:
                    self._last_poll, self._every = now, every
                    await self._poll(now)
                await asyncio.sleep(_WAITED if self._checks.waiters else _FAST)
        finally:
            await self.api.close()

    def _behind(self) -> bool:
        # Checked every 50 ms: from the newest beacon only, without copying the history. A
        # Traefik not yet seen serving any beacon while records exist is checked as often: what
        # is written meanwhile waits for its first one (see `behind`).
        if self._shown is None and self._store.records:
            return True
        for view in self._views.values():
            latest = self._observed.beacons.latest(view.root)
            if view.state != "converged" or (latest is not None and latest.revision > view.applied_revision):
                return True
        return False

    async def _poll(self, now: float) -> None:
        try:
            self._shown = await self.api.beacon()
            if now - self._last_routers >= self._poll_interval:
                self._last_routers = now
                self._diagnosis.broken = await self.api.broken_routers()
            if self._unreachable_since is not None:
                logger.info("Traefik's API at {} answers again", self.api.url)
            self._unreachable_since = None
        except TraefikUnreachable as exc:
            if self._unreachable_since is None:
                logger.warning("{}", exc.title)
                self._unreachable_since = now
        if self._shown is not None:
            self._served_root = self._shown.partition(" ")[0]
            # The sidecar's own root has its apply series at 0 before its first write is applied.
            self._apply.labels(self._served_root)
        self._update(now)
        await self._checks.done()

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener` after every check of Traefik (the pacer flushes what Traefik has room for)."""
        self._checks.add_listener(listener)

    # ----- states

    def _written_roots(self) -> set[str]:
        written = {self._layout.root(ref.authority) for ref in [*self._store.records, *self._store.tombstones]}
        if self._served_root is None:
            return written
        return written & {self._served_root}

    def _update(self, now: float) -> None:
        roots = self._written_roots()
        for gone in set(self._views) - roots:
            del self._views[gone]
            self._apply.remove(gone)
        for root in sorted(roots):
            if root not in self._views:
                # At 0 from the start: rate() does not see the first sample of a series born at 1.
                self._apply.labels(root)
            view = self._views.setdefault(root, RootConvergence(root))
            self._update_root(view, now)

    def _update_root(self, view: RootConvergence, now: float) -> None:
        history = self._observed.beacons.history(view.root)
        view.committed_revision = history[-1].revision if history else 0
        if self._unreachable_since is None:
            previous, view.applied_revision = view.applied_revision, _applied_revision(self._shown, view.root, history)
            if view.applied_revision > previous:
                _applied(view, history, now, previous, self._apply, self._tracing, self._every)
        behind = [w for w in history if w.revision > view.applied_revision]
        behind_since = behind[0].seen_at if behind else None
        view.lag_seconds = now - behind_since if behind_since is not None else 0.0
        state: State
        if self._unreachable_since is not None:
            state = "unreachable"
        elif not history or behind_since is not None:
            state = "frozen" if view.lag_seconds > self._max_lag else "pending"
        else:
            state = "converged"
        if state != view.state:
            logger.log("INFO" if state in ("converged", "pending") else "WARNING",
                       "traefik {} on {} (committed {}, applied {})", state, view.root,
                       view.committed_revision, view.applied_revision)
            view.state, view.since = state, time.time()
            self._diagnosis.rescan()  # a new state gets a fresh report
            if self._on_state is not None:
                self._on_state(view.root, state, f"traefik {state} on {view.root} (committed {view.committed_revision}, "
                                   f"applied {view.applied_revision})")
        self._diagnosis.update(view, now)

    # ----- views

    def roots(self) -> list[RootConvergence]:
        """Every observed root, by name."""
        return [self._views[r] for r in sorted(self._views)]

    def behind(self, root: str) -> bool:
        """True when this Traefik may read `root` and has not applied the newest commit on it.

        A Traefik that has shown a beacon reads that beacon's root only. One that has shown none
        yet (a fresh root: its first commit is on the way) is behind on each root of ours it has not
        applied, until it shows one, or one of them has waited `max_lag` (it reads none of ours).
        False once its API has not answered for `max_lag` (a Traefik rebuilding a large root may
        not answer for a few seconds): no root is held for a Traefik that never applies it.
        """
        if self._served_root not in (None, root):
            return False
        if self._unreachable_since is not None and time.monotonic() - self._unreachable_since > self._max_lag:
            return False
        latest = self._observed.beacons.latest(root)
        # A root this sidecar first wrote since the last check has no view yet: Traefik's beacon decides.
        view = self._views.get(root)
        applied = (
            view.applied_revision if view is not None else _applied_revision(self._shown, root, self._observed.beacons.history(root))
        )
        if latest is None or latest.revision <= applied:
            return False
        return self._served_root is not None or not any(v.lag_seconds > self._max_lag for v in self._views.values())

    def served(self, root: str, revision: int) -> bool:
        """True when Traefik has applied `root` at `revision` or later."""
        view = self._views.get(root)
        return view is not None and view.state != "unreachable" and view.applied_revision >= revision

    def router_errors_of(self, ref: IngressRef) -> list[dict[str, Any]]:
        """Broken routers of one ingress, as Traefik reports them."""
        view = self._views.get(self._layout.root(ref.authority))
        name = self._layout.object_name(ref)
        return [e for e in view.router_errors if e["router"] == name or e["router"].startswith(name + "_")] if view else []

    async def wait_until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Check `done` after every check of Traefik (every 10 ms while anyone waits); False after `timeout` s."""
        return await self._checks.wait_until(done, timeout)

    async def wait_served(self, targets: Mapping[str, int], timeout: float) -> None:
        """Until Traefik has applied each root at its revision; NotServedInTime after `timeout` s."""
        if not await self.wait_until(lambda: all(self.served(r, rev) for r, rev in targets.items()), timeout):
            late = [(r, rev) for r, rev in sorted(targets.items()) if not self.served(r, rev)]
            if late:
                raise self.not_served(*late[0])

    def not_served(self, root: str, revision: int, pending: int = 0) -> NotServedInTime:
        """The error of a wait that timed out on `root` (`pending`: ingresses whose keys still wait to be written)."""
        return not_served_error(self._views.get(root) or RootConvergence(root), revision, pending)

    def readiness(self) -> list[str]:
        """Why Traefik does not serve what is committed, once that has lasted longer than `max_lag`."""
        now = time.monotonic()
        if self._unreachable_since is not None and now - self._unreachable_since > self._max_lag:
            return ["traefik unreachable"]
        reasons = []
        for view in self.roots():
            if view.state == "frozen":
                blocked = f": blocked by key {view.blocking_keys[0]}" if view.blocking_keys else ""
                reasons.append(f"traefik frozen on {view.root}{blocked}")
        return reasons


def not_served_error(view: RootConvergence, revision: int, pending: int) -> NotServedInTime:
    """Why a wait for `view`'s root at `revision` timed out (`pending`: ingresses whose keys still wait to be written)."""
    what = f"{pending} ingress(es) committed, their keys held until Traefik applies the previous commit" if pending else (
        f"committed at revision {revision}, but Traefik has not served it yet"
    )
    return NotServedInTime(
        f"{what} ({view.state} on {view.root}); the change stays committed",
        {"committed_revision": revision, "applied_revision": view.applied_revision, "state": view.state,
         "blocking_keys": view.blocking_keys},
    )


def _applied(
    view: RootConvergence, history: list[BeaconWrite], now: float, previous: int, apply: Histogram, tracing: Tracing, every: float
) -> None:
    """Seen applied at this poll, checking every `every` s: tracing is told; its apply time, from when the commit
    was seen to now, is observed (to within a poll: 50 ms while behind, 10 ms while a request waits), but for
    the first revision seen applied."""
    tracing.served(view.root, view.applied_revision, every)
    if not previous:
        return
    write = next((w for w in reversed(history) if w.revision == view.applied_revision), None)
    if write is not None:
        view.applies.append(max(0.0, now - write.seen_at))
        apply.labels(view.root).observe(view.applies[-1])


def _applied_revision(shown: str | None, root: str, history: list[BeaconWrite]) -> int:
    """The revision of the beacon value Traefik shows for `root` (0: another root's, or older than anything seen)."""
    shown_root, _, _token = (shown or "").partition(" ")
    if shown_root != root:
        return 0
    for write in reversed(history):
        if write.value == shown:
            return write.revision
    return 0
