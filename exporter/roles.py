"""The small roles the reconciler is built with, so each collaborator is passed in, typed, at construction.

- `LeaderPolicy`: whether this exporter may make leader-only writes, and the fence compare
  they carry (`leader.Leadership`; `AlwaysLeader` for a single daemon or a dry run).
- `Ejections`: the server URLs health checking keeps out of the load balancers
  (`health.engine.HealthEngine`; `NoEjections` without health checking).
- `Admission`: a check every pushed ingress passes before it is queued (the health engine
  refuses an upstream kind no plugin provides; `AdmitAll` otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .etcd.types import Compare
from .ingress import Ingress
from .keys import IngressRef


class LeaderPolicy(Protocol):
    """Leadership as the writers see it."""

    def is_leader(self) -> bool:
        """True while this exporter may repair drift, reconcile and write health changes."""
        ...

    def fence(self) -> Sequence[Compare]:
        """The compares every leader-only transaction carries (empty when not leader)."""
        ...


class AlwaysLeader:
    """No election: this exporter is the only writer."""

    def is_leader(self) -> bool:
        """Always True."""
        return True

    def fence(self) -> Sequence[Compare]:
        """No fence."""
        return ()


class Ejections(Protocol):
    """What rendering leaves out of an ingress's load balancers."""

    def ejected(self, ref: IngressRef, ingress: Ingress) -> frozenset[str]:
        """URLs of servers and instances that must receive no traffic now."""
        ...


class NoEjections:
    """Health checking off: every server is rendered."""

    def ejected(self, ref: IngressRef, ingress: Ingress) -> frozenset[str]:
        """Nothing."""
        return frozenset()


class Admission(Protocol):
    """A check of a pushed ingress beyond its own validation."""

    def admit(self, ingress: Ingress) -> None:
        """Raise an ExporterError (ValidationFailed) to refuse `ingress`."""
        ...


class AdmitAll:
    """Every valid ingress is admitted."""

    def admit(self, ingress: Ingress) -> None:
        """Nothing to check."""


class AllOf:
    """Every check in turn (the health engine's, then the edge fields' bounds)."""

    def __init__(self, *checks: Admission) -> None:
        self._checks = checks

    def admit(self, ingress: Ingress) -> None:
        """Raise the first check's refusal."""
        for check in self._checks:
            check.admit(ingress)
