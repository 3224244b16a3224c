"""Compute a Plan from the desired records, the health ejections and the observed keys."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from loguru import logger

from ..errors import TemplateError
from ..ingress import Ingress
from ..render.renderer import Renderer
from ..render.root_keys import CERT_KEY, KEY_KEY, DefaultCertificate, root_keys
from ..store.records import Record, owner_of_record_key, record_key
from .observed import Observed
from .ownership import is_root_owned
from .plan import Plan, UnitPlan, plan_ingress, plan_root

Owner = tuple[str, str]
# (ingress key, ingress) -> URLs of servers/instances the load balancers must leave out.
Ejections = Callable[[Owner, Ingress], frozenset[str]]


def NO_EJECTIONS(_owner: Owner, _ingress: Ingress) -> frozenset[str]:
    """Health checking off: every server is rendered."""
    return frozenset()


class Planner:
    """Diffs desired state against `observed`; cost is proportional to the owners planned."""

    def __init__(self, renderer: Renderer, records_prefix: str, certificate: DefaultCertificate) -> None:
        self.renderer = renderer
        self.records_prefix = records_prefix
        self.certificate = certificate
        self.errors: dict[Owner, str] = {}

    def plan(
        self,
        desired: Mapping[Owner, Record],
        observed: Observed,
        owners: Iterable[Owner] | None = None,
        ejected: Ejections = NO_EJECTIONS,
        include_roots: bool = True,
    ) -> Plan:
        """Plan `owners` (every known ingress when None, with the foreign-key report).

        The root keys of the roots involved are planned too, unless `include_roots` is False.
        """
        full = owners is None
        observed_records = observed.records() if full else {}
        if owners is None:
            owners = set(desired) | self._recorded(observed_records)
        else:
            owners = set(owners)
        plan = Plan()
        roots = {self.renderer.root_for(owner[0]) for owner in (desired if full else owners) if owner in desired}
        for root in sorted(roots) if include_roots else ():
            unit = self._plan_root(root, observed)
            if unit is not None:
                plan.units.append(unit)
        for owner in sorted(owners):
            unit = self._plan_owner(owner, desired.get(owner), observed, ejected)
            if unit is not None:
                plan.units.append(unit)
        if full:
            plan.foreign = self._foreign(desired, observed, observed_records)
        return plan

    def _plan_root(self, root: str, observed: Observed) -> UnitPlan | None:
        keys = root_keys(root, self.certificate)
        keep = frozenset({f"{root}/{CERT_KEY}", f"{root}/{KEY_KEY}"}) if self.certificate.generated else frozenset()
        seen = {k: observed.keys[k] for k in keys if k in observed.keys}
        return plan_root(root, keys, seen, keep)

    def _plan_owner(
        self, owner: Owner, record: Record | None, observed: Observed, ejected: Ejections
    ) -> UnitPlan | None:
        rkey = record_key(self.records_prefix, *owner)
        root = self.renderer.root_for(owner[0])
        observed_record = observed.record(rkey)
        if record is None and observed_record is None:
            # No record anywhere: whatever carries this name is not ours.
            return None
        desired_kv: dict[str, str] | None = None
        desired_objects: tuple[str, ...] = ()
        if record is not None and not record.removed:
            try:
                rendered = self.renderer.render(record.ingress, ejected(owner, record.ingress), record.content)
            except TemplateError as exc:
                self.errors[owner] = exc.title
                logger.error("not writing {}/{}: {}", owner[0], owner[1], exc.title)
                return None
            self.errors.pop(owner, None)
            desired_kv = rendered.kv
            desired_objects = tuple(f"{root}/{o}" for o in rendered.objects)
        return plan_ingress(
            owner=owner,
            desired=desired_kv,
            observed_objects=observed.objects_of(owner, root),
            desired_objects=desired_objects,
            record_key=rkey,
            desired_record=record,
            observed_record=observed_record,
        )

    def _foreign(
        self, desired: Mapping[Owner, Record], observed: Observed, observed_records: Mapping[str, tuple[str, int]]
    ) -> list[str]:
        known = set(desired) | self._recorded(observed_records)
        roots = {self.renderer.root_for(a) for a, _ in known}
        foreign = []
        for root in sorted(roots):
            for key in observed.under_root(root):
                if is_root_owned(root, key):
                    continue
                owner = observed.owner_of_key(key)
                if owner is None or owner not in known or self.renderer.root_for(owner[0]) != root:
                    foreign.append(key)
        return sorted(foreign)

    def _recorded(self, record_keys: Iterable[str]) -> set[Owner]:
        owners = (owner_of_record_key(self.records_prefix, key) for key in record_keys)
        return {owner for owner in owners if owner is not None}
