"""Readiness: why a daemon is not ready (what `/readyz` answers), and whether it takes pushes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..etcd.client import EtcdClient
from ..leader import Leadership
from ..reconcile import Reconciler
from ..render.ca_files import CaFiles
from ..sources.files import IngressFiles
from ..supervisor import Supervisor
from ..traefik.observer import TraefikObserver


class Reporting(Protocol):
    """A part that says why it keeps the daemon from being ready (service discovery: loaded only when configured)."""

    def readiness(self) -> list[str]:
        """Reasons; empty when the part is fine."""


@dataclass(frozen=True)
class Readiness:
    """The parts whose state makes a daemon ready; every reason is a sentence an operator acts on."""

    etcd: EtcdClient
    reconciler: Reconciler
    files: IngressFiles
    ca_files: CaFiles
    supervisor: Supervisor
    leadership: Leadership | None = None
    observer: TraefikObserver | None = None
    discovery: Reporting | None = None

    def reasons(self) -> list[str]:
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
        elif not self.files.synced:
            reasons.append("ingress files not applied yet")
        reasons += [f"ingress file {path}: {error}" for path, error in sorted(self.files.errors.items())]
        reasons += [f"ingress {ref}: {error.title}" for ref, error in sorted(self.reconciler.render_errors.items())]
        if self.observer is not None:
            reasons += self.observer.readiness()
        if self.discovery is not None:
            reasons += self.discovery.readiness()
        return reasons + self.ca_files.problems() + self.supervisor.readiness()

    def accepting(self) -> bool:
        """True when pushes can be taken: synced with etcd, and etcd answers."""
        status = self.reconciler.status
        return status.synced and status.etcd_ok and self.etcd.reachability().reachable is not False
