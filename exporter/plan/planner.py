"""Compute a Plan from the desired records, the health ejections and the observed keys."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from loguru import logger

from ..errors import TemplateError
from ..keys import CERT_KEY, KEY_KEY, SHARED_SECTIONS, IngressRef, KeyLayout
from ..render.renderer import RenderedIngress, Renderer, RenderKey
from ..render.root_keys import DefaultCertificate, root_keys
from ..render.shared import SharedObject
from ..roles import Ejections, NoEjections
from ..store.observed import Observed
from ..store.records import Record
from .diff import plan_ingress, plan_orphan, plan_root, plan_shared
from .plan import Plan, UnitPlan

_NO_EJECTIONS = NoEjections()


class Planner:
    """Diffs desired state against `observed`; cost is proportional to the owners planned.

    An ingress found as it renders is remembered with what its render depended on and the
    stamp of its observed keys: while neither changes, planning it again (every full pass)
    only compares the two, without rendering or diffing it.

    Shared objects (render/shared.py) are planned beside the ingresses that reference them:
    one that a planned ingress references and etcd does not hold as rendered is written (with
    the first transaction that needs it); with the roots, every orphan is deleted, and a full
    pass repairs every one in use that differs.
    """

    def __init__(self, renderer: Renderer, layout: KeyLayout, certificate: DefaultCertificate) -> None:
        self._renderer = renderer
        self._layout = layout
        self._certificate = certificate
        self._errors: dict[IngressRef, TemplateError] = {}
        self._as_rendered: dict[IngressRef, tuple[RenderKey, tuple[int, ...]]] = {}

    @property
    def errors(self) -> Mapping[IngressRef, TemplateError]:
        """Ingresses whose last render failed (their keys are left as they are)."""
        return self._errors

    def admit(self, record: Record, ejections: Ejections = _NO_EJECTIONS) -> None:
        """Raise TemplateError when Traefik would reject what `record` renders to.

        Only a user template can fail: those ingresses are rendered now (warming the cache);
        the others are rendered when planned, so a large request's first transactions are
        written while the rest of it is still being rendered.
        """
        if self._renderer.may_refuse(record.ingress):
            self._renderer.render(record.ingress, ejections.ejected(record.key, record.ingress), record.value)

    def rendered(self, record: Record, ejections: Ejections = _NO_EJECTIONS) -> dict[str, str]:
        """The keys `record` renders to now (none for a removal); raises TemplateError."""
        if record.removed:
            return {}
        return dict(self._renderer.render(record.ingress, ejections.ejected(record.key, record.ingress), record.value).kv)

    def plan(
        self,
        desired: Mapping[IngressRef, Record],
        observed: Observed,
        owners: Iterable[IngressRef] | None = None,
        ejections: Ejections = _NO_EJECTIONS,
        include_roots: bool = True,
    ) -> Plan:
        """Plan `owners` (every known ingress when None, with the foreign-key report).

        The root keys of the roots involved are planned too, unless `include_roots` is False.
        """
        full = owners is None
        observed_records = observed.records() if full else {}
        wanted = set(desired) | self._recorded(observed_records) if owners is None else set(owners)
        plan = Plan(revision=observed.revision)
        roots = {self._layout.root(ref.authority) for ref in (desired if full else wanted) if ref in desired}
        for root in sorted(roots) if include_roots else ():
            unit = self._plan_root(root, observed)
            if unit is not None:
                plan.units.append(unit)
        owned: list[UnitPlan] = []
        shared: dict[str, SharedObject] = {}
        for ref in sorted(wanted):
            unit = self._plan_owner(ref, desired.get(ref), observed, ejections, shared)
            if unit is not None:
                owned.append(unit)
        # Every shared object in use is checked only by a full pass (a foreign edit of one asks for
        # a full pass): at thousands of them, a push would otherwise compare them all.
        plan.units += self._plan_shared(shared, observed, sorted(roots) if full else [])
        plan.units += owned
        if include_roots:
            plan.units += self._plan_orphans(sorted(roots), shared, observed)
        if full:
            plan.foreign = self._foreign(desired, observed, observed_records)
        return plan

    def plan_orphans(self, roots: Iterable[str], observed: Observed) -> Plan:
        """The deletion of every shared object under `roots` that nothing references."""
        return Plan(units=self._plan_orphans(sorted(roots), {}, observed), revision=observed.revision)

    def _plan_shared(self, wanted: Mapping[str, SharedObject], observed: Observed, roots: list[str]) -> list[UnitPlan]:
        """The shared objects planned ingresses reference, and (with `roots`) every one in use there, that etcd holds otherwise."""
        objects = dict(wanted)
        for root in roots:
            for path in observed.sharing.referenced_under(root):
                found = self._renderer.shared.get(path)
                if found is not None:
                    objects.setdefault(path, found)
        units = []
        for path, obj in sorted(objects.items()):
            root = path.rsplit("/", 3)[0]
            unit = plan_shared(path, root, obj.kv, observed.shared(path), standalone=observed.sharing.references(path) > 0)
            if unit is not None:
                units.append(unit)
        return units

    def _plan_orphans(self, roots: list[str], wanted: Mapping[str, SharedObject], observed: Observed) -> list[UnitPlan]:
        """Delete the shared objects of `roots` that nothing references and no planned ingress wants."""
        if not observed.sharing.orphans():
            return []
        units = []
        for root in roots:
            for path in observed.sharing.orphans(root):
                if path in wanted:
                    continue
                section = path.rsplit("/", 2)[1]
                # Its content is kept while it is in use, to repair it; rendered again if wanted again.
                self._renderer.shared.forget(path)
                units.append(plan_orphan(path, root, observed.shared(path), f"{root}/http/{SHARED_SECTIONS[section]}/", observed.revision))
        return units

    def _plan_root(self, root: str, observed: Observed) -> UnitPlan | None:
        keys = root_keys(root, self._certificate)
        # The beacon is created once; afterwards every transaction under the root rewrites it.
        keep = frozenset({self._layout.beacon_key(root)})
        if self._certificate.generated:
            keep |= {f"{root}/{CERT_KEY}", f"{root}/{KEY_KEY}"}
        seen = {k: kv for k in keys if (kv := observed.get(k)) is not None}
        return plan_root(root, keys, seen, keep)

    def _plan_owner(
        self, ref: IngressRef, record: Record | None, observed: Observed, ejections: Ejections, shared: dict[str, SharedObject]
    ) -> UnitPlan | None:
        rkey = self._layout.record_key(ref)
        observed_record = observed.record(rkey)
        self._errors.pop(ref, None)
        if record is None and observed_record is None:
            # No record anywhere: whatever carries this name is not ours.
            return None
        if record is None or record.removed:
            self._as_rendered.pop(ref, None)
            rendered, render_key = None, None
        else:
            found = self._render(ref, record, observed_record, observed, ejections)
            if found is None:
                return None
            rendered, render_key = found
        observed_objects = observed.objects_of(ref)
        unit = plan_ingress(
            owner=ref,
            desired=rendered.kv if rendered is not None else None,
            observed_objects=observed_objects,
            record_key=rkey,
            desired_record=record,
            observed_record=observed_record,
            root=self._layout.root(ref.authority),
        )
        if unit is None and render_key is not None:
            self._as_rendered[ref] = (render_key, observed.stamp(ref))
            self._renderer.forget(render_key)
        if unit is not None and rendered is not None and rendered.shared:
            shared.update((obj.path, obj) for obj in rendered.shared)
            unit.needs = self._new_references(rendered.shared, observed_objects)
        return unit

    def _render(
        self, ref: IngressRef, record: Record, observed_record: tuple[str, int] | None, observed: Observed, ejections: Ejections
    ) -> tuple[RenderedIngress, RenderKey] | None:
        """What a live ingress renders to, and what that depends on; None when there is nothing to plan
        (its record and keys are as when last found as rendered, or its render failed)."""
        ejected = ejections.ejected(ref, record.ingress)
        render_key = self._renderer.key_of(record.ingress, ejected, record.value)
        found = self._as_rendered.get(ref)
        if (
            found is not None and found[0] == render_key and observed_record is not None and observed_record[0] == record.value
            and found[1] == observed.stamp(ref)
        ):
            return None
        try:
            return self._renderer.render(record.ingress, ejected, key=render_key), render_key
        except TemplateError as exc:
            self._errors[ref] = exc
            logger.error("not writing {}: {}", ref, exc.title)
            return None

    def _new_references(
        self, references: tuple[SharedObject, ...], observed: dict[str, dict[str, tuple[str, int]]]
    ) -> tuple[tuple[str, str], ...]:
        """The shared objects among `references` that no observed key of the ingress names yet, with their witness keys."""
        named = {self._layout.shared_reference(k, v) for keys in observed.values() for k, (v, _m) in keys.items()}
        return tuple((o.path, o.witness) for o in references if o.path not in named)

    def _foreign(
        self, desired: Mapping[IngressRef, Record], observed: Observed, observed_records: Mapping[str, tuple[str, int]]
    ) -> list[str]:
        named: dict[str, set[tuple[str, str]]] = {}
        for ref in set(desired) | self._recorded(observed_records):
            named.setdefault(self._layout.root(ref.authority), set()).add(self._layout.object_key(ref))
        return sorted(key for root, owned in named.items() for key in observed.foreign(root, owned))

    def _recorded(self, record_keys: Iterable[str]) -> set[IngressRef]:
        refs = (self._layout.record_ref(key) for key in record_keys)
        return {ref for ref in refs if ref is not None}
