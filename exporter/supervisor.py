"""The supervisor of every long-running task: a crash is logged, counted and restarted, never silent.

Each task is started through `Supervisor.spawn`: an exception other than cancellation is
logged with its traceback, counted in `exporter_task_restarts_total{task}` and the task is
started again after a backoff (0.5 s, doubling to 30 s; back to 0.5 s once a run has lasted
a minute). A task that crashed `failing_after` times in a row, each time within a minute of
starting, is reported by `readiness()` (so `/readyz`) until a run lasts. Whoever spawns a task
still owns its lifetime: it cancels the task it was handed, and a task that returns is done.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from loguru import logger

from .metrics import Metrics

_BACKOFF_FIRST = 0.5
_BACKOFF_MAX = 30.0
# A run that lasted this long was healthy: the backoff and the crash count start over.
_HEALTHY_RUN = 60.0


@dataclass(slots=True)
class _Crashes:
    in_a_row: int = 0
    last_error: str = ""
    # When the current run started (None: waiting out its backoff).
    running_since: float | None = None


class Supervisor:
    """Runs tasks that restart after a crash; `readiness()` names those that keep failing."""

    def __init__(
        self, *, failing_after: int = 3, backoff_first: float = _BACKOFF_FIRST, backoff_max: float = _BACKOFF_MAX,
        healthy_run: float = _HEALTHY_RUN, metrics: Metrics | None = None,
    ) -> None:
        self._failing_after = failing_after
        self._healthy_run = healthy_run
        self._backoff_first = backoff_first
        self._backoff_max = backoff_max
        self._crashes: dict[str, _Crashes] = {}
        self.metrics = metrics or Metrics()

    def spawn(self, name: str, run: Callable[[], Awaitable[None]], *, group: str | None = None) -> asyncio.Task[None]:
        """Start `run()` as a supervised task called `name`; `group` labels its restarts (default: the name)."""
        # The series exists at 0 before the first crash: increase() over a series that first
        # appears at 1 reads 0, and the first crash would never raise ExporterTaskCrashes.
        self.metrics.task_restarts.labels(group or name)
        return asyncio.create_task(self._supervise(name, group or name, run), name=name)

    async def _supervise(self, name: str, group: str, run: Callable[[], Awaitable[None]]) -> None:
        backoff = self._backoff_first
        while True:
            started = time.monotonic()
            if (known := self._crashes.get(name)) is not None:
                known.running_since = started
            try:
                await run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the point of a supervisor: no crash ends a task silently
                lasted = time.monotonic() - started
                crashes = self._crashes.setdefault(name, _Crashes())
                if lasted >= self._healthy_run:
                    crashes.in_a_row, backoff = 0, self._backoff_first
                crashes.in_a_row += 1
                crashes.last_error = f"{type(exc).__name__}: {exc}"
                crashes.running_since = None
                self.metrics.task_restarts.labels(group).inc()
                logger.opt(exception=exc).error(
                    "task {} crashed ({} in a row); restarting in {:.1f}s", name, crashes.in_a_row, backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._backoff_max)
                continue
            self._crashes.pop(name, None)
            return

    def readiness(self) -> list[str]:
        """The tasks that keep failing (and whose current run has not lasted a minute yet), with their last error."""
        now = time.monotonic()
        return [
            f"task {name} keeps failing ({c.in_a_row} crashes in a row): {c.last_error}"
            for name, c in sorted(self._crashes.items())
            if c.in_a_row >= self._failing_after and (c.running_since is None or now - c.running_since < self._healthy_run)
        ]
