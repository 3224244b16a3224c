"""Write policies: which planned units are written now and which are held out.

The committer applies every policy at one seam, in order, to the units of each plan: units
in, units now and units held out. A new policy (a quiet window, a budget per root) is one
class here and one line where the reconciler lists its policies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..keys import IngressRef
from ..plan import guards
from ..plan.plan import UnitPlan
from ..roles import LeaderPolicy
from .pacer import Pacer


@dataclass(slots=True)
class Split:
    """What a policy lets through now, and what it holds out (written later, or by another writer)."""

    now: list[UnitPlan] = field(default_factory=list)
    held: list[UnitPlan] = field(default_factory=list)


class WritePolicy(Protocol):
    """One rule on what is written when."""

    # The batch is planned as one plan, not pipelined in chunks (fewer, larger transactions).
    whole_batches: bool

    def split(self, units: list[UnitPlan], requested: Mapping[IngressRef, int], reasons: Mapping[IngressRef, str]) -> Split:
        """Split `units`; `requested` maps each requested ingress to its request, `reasons` the others to why they change."""

    def committed(self, units: Sequence[UnitPlan]) -> None:
        """`units` (let through by every policy) committed."""


class FollowerRule:
    """A follower, and a leader deposed between two conflict retries, writes only what requests ask for.

    Never a leader-only change unfenced: the leader makes the rest (repair, reconcile, health).
    """

    whole_batches = False

    def __init__(self, leader: LeaderPolicy) -> None:
        self._leader = leader

    def split(self, units: list[UnitPlan], requested: Mapping[IngressRef, int], reasons: Mapping[IngressRef, str]) -> Split:
        """Every unit for the leader; else requested ingresses, the shared objects they need, and a root's own keys riding with a request.

        A shared object's repair or deletion is the leader's.
        """
        if self._leader.is_leader():
            return Split(now=units)
        out = Split()
        for unit in units:
            mine = unit.owner in requested or (unit.owner is None and bool(requested) and not unit.standalone)
            (out.now if mine else out.held).append(unit)
        return out

    def committed(self, units: Sequence[UnitPlan]) -> None:
        """Nothing to remember."""


class PacingRule:
    """While a root's Traefik is behind (write/pacer.py), its keys are held; a request's record commits alone."""

    def __init__(self, pacer: Pacer) -> None:
        self._pacer = pacer
        # Paced to a Traefik, revisions under a root cost more than the latency pipelining saves.
        self.whole_batches = pacer.enabled

    def split(self, units: list[UnitPlan], requested: Mapping[IngressRef, int], reasons: Mapping[IngressRef, str]) -> Split:
        """On a paced root: the record alone (a request's, or one with no key to hold) now, the keys held.

        A shared object's repair or deletion waits too (planned again with its root); one an
        ingress needs goes only with that ingress's keys.
        """
        out = Split()
        for unit in units:
            ref = unit.owner
            if ref is None and unit.standalone and self._pacer.paced(unit.root):
                out.held.append(unit)
                continue
            if ref is None or not self._pacer.paced(unit.root):
                out.now.append(unit)
                continue
            held = any(c.key != unit.record_key for c in unit.changes)
            if held:
                self._pacer.hold(ref, unit.root, "request" if ref in requested else reasons.get(ref, "reconcile"))
                out.held.append(unit)
            alone = guards.record_alone(unit, keys_held=held)
            if alone is not None and (ref in requested or not held):
                out.now.append(alone)
        return out

    def committed(self, units: Sequence[UnitPlan]) -> None:
        """Keys written under a root are no longer held."""
        self._pacer.release(u.owner for u in units if u.owner is not None and u.root)
