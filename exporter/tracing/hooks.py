"""Where the pipeline tells tracing what happened: one object, `Tracing`, whose methods do nothing.

The parts of the daemon call these hooks whether or not tracing is on; `tracing/otel.py`
overrides them with OpenTelemetry spans, and is imported only when `otel.enabled` is set,
so a daemon without tracing never loads OpenTelemetry. What a hook is given is plain data
(times in ns since the epoch, revisions, ingress refs), built only when `enabled` is True.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..keys import IngressRef


class ClientCall:
    """One call this daemon makes to another system: the headers that carry its span, and its answer."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}

    def answered(self, status: int) -> None:
        """The peer answered with HTTP `status` (not 2xx: the span ends with an error status)."""

    def failed(self, error_type: str) -> None:
        """The call got no answer (`error_type`: why): the span ends with an error status."""


class PushSpan:
    """The span of one push request, as the push API's middleware holds it (this one records nothing)."""

    def refused(self, error_type: str) -> None:
        """The push was refused: its span ends with an error status naming `error_type`."""

    def finish(self, status: int, ingresses: int) -> None:
        """The response's status and how many ingresses the push carried."""


@dataclass(frozen=True, slots=True)
class TxnRecord:
    """One transaction the writer sent, as tracing sees it.

    `refs`: the ingresses whose changes it carried; `roots`: each root it wrote keys under, with
    the ingresses whose keys those were; `revision`: what it committed at (or, when it lost a
    compare, etcd's revision then).
    """

    started_ns: int
    ended_ns: int
    succeeded: bool
    revision: int
    operations: int
    refs: tuple[IngressRef, ...]
    roots: Mapping[str, tuple[IngressRef, ...]]


class Tracing:
    """Tracing switched off: every hook is a no-op and `enabled` is False."""

    enabled = False
    NO_SPAN = PushSpan()

    @contextlib.contextmanager
    def push(self, method: str, route: str, headers: Mapping[str, str], request_id: str, waits: bool) -> Iterator[PushSpan]:
        """The SERVER span of one push, current while the handler runs (continuing the caller's `traceparent`)."""
        yield self.NO_SPAN

    def staged(self) -> Any:
        """The current push was checked and its intents are queued: what the batch needs to know of it (None: untraced)."""
        return None

    @contextlib.contextmanager
    def batch(self, staged: Sequence[tuple[Any, IngressRef]], paced_roots: frozenset[str]) -> Iterator[None]:
        """The write of one batch: `staged` pairs each intent's `staged()` with its ingress; `paced_roots`
        are the roots whose held keys the batch writes (write/pacer.py)."""
        yield

    def planned(self, started_ns: int, revision: int, refs: Sequence[IngressRef]) -> None:
        """A plan of `refs` against the mirror at `revision`, from `started_ns` to now."""

    def txn(self, record: TxnRecord) -> None:
        """A transaction was answered."""

    def expect_served(self) -> None:
        """An observer will tell what Traefik serves (without one, commits are not kept waiting for it)."""

    def served(self, root: str, revision: int, poll_interval: float) -> None:
        """The observer saw Traefik serve `root` at `revision`, checking every `poll_interval` s."""

    @contextlib.contextmanager
    def probe_changed(self, name: str, node: str, started_ns: int, attributes: Mapping[str, str]) -> Iterator[None]:
        """A probe changed a node's state: its span (from `started_ns`), current while the change is announced."""
        yield

    def linked(self) -> Any:
        """The current span, to link from later work (a notification of a probe's change); None without one."""
        return None

    @contextlib.contextmanager
    def notification(self, url: str, events: int, links: Sequence[Any]) -> Iterator[ClientCall]:
        """The CLIENT span of one notification to the coordinator, linked to the probes it tells of; the call's
        headers carry it (`traceparent`)."""
        yield ClientCall()

    def shutdown(self) -> None:
        """Export what is queued and stop (the daemon is stopping)."""


NO_TRACING = Tracing()
