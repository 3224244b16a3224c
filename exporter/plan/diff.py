"""The diff of one ingress (or one root's own keys, or one shared object): desired keys against what etcd holds for it.

Pure functions, no side effects: the planner calls them per ingress, `diff` and `run --dry-run`
print what they return. Order and guards are the commit rule's (plan/guards.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..etcd.types import Compare
from ..keys import IngressRef
from ..store.records import Record
from . import guards
from .plan import Change, UnitPlan


def plan_ingress(
    *,
    owner: IngressRef,
    desired: dict[str, str] | None,
    observed_objects: dict[str, dict[str, tuple[str, int]]],
    record_key: str,
    desired_record: Record | None,
    observed_record: tuple[str, int] | None,
    root: str = "",
) -> UnitPlan | None:
    """Diff one ingress: `desired` keys (None: remove it) against what etcd holds for it."""
    want = desired or {}
    observed_keys = {key: value for keys in observed_objects.values() for key, (value, _mod) in keys.items()}
    if observed_keys:
        changes = [Change(key, observed_keys.get(key), value) for key, value in want.items() if observed_keys.get(key) != value]
        changes += [Change(key, value, None) for key, value in observed_keys.items() if key not in want]
    else:  # nothing of it in etcd yet (every ingress of a bulk sync)
        changes = [Change(key, None, value) for key, value in want.items()]
    record_value = desired_record.value if desired_record is not None else None
    old_record = observed_record[0] if observed_record else None
    record = Change(record_key, old_record, record_value) if record_value != old_record else None
    if not changes and record is None:
        return None
    if record is None and old_record is not None:
        # Keys change, the record does not: it is put again all the same, so that its revision is
        # the ingress's last change and a plan made before it fails its record compare.
        record = Change(record_key, old_record, old_record)
    return UnitPlan(
        name=str(owner),
        changes=guards.with_record(guards.order_changes(changes), record),
        compares=[guards.record_guard(record_key, observed_record)],
        owner=owner,
        record_key=record_key,
        record=desired_record,
        removed=desired is None,
        root=root,
    )


def plan_root(
    root: str, desired: dict[str, str], observed: dict[str, tuple[str, int]], keep_existing: frozenset[str]
) -> UnitPlan | None:
    """Diff one root's own keys; keys in `keep_existing` (a generated certificate) are only created."""
    changes = []
    compares = []
    for key, value in desired.items():
        seen = observed.get(key)
        if seen is None:
            changes.append(Change(key, None, value))
        elif seen[0] != value and key not in keep_existing:
            changes.append(Change(key, seen[0], value))
        else:
            continue
        compares.append(Compare(key, "EQUAL", seen[1] if seen else 0))
    if not changes:
        return None
    return UnitPlan(name=f"root {root}", changes=changes, compares=compares, root=root)


def plan_shared(
    path: str, root: str, desired: Mapping[str, str], observed: dict[str, tuple[str, int]], *, standalone: bool
) -> UnitPlan | None:
    """Diff one shared object (render/shared.py) against its observed keys.

    Its name is its content: any writer writes the same keys, so the puts need no guard.
    """
    changes = [Change(key, observed[key][0] if key in observed else None, value)
               for key, value in desired.items() if key not in observed or observed[key][0] != value]
    changes += [Change(key, value, None) for key, (value, _mod) in observed.items() if key not in desired]
    if not changes:
        return None
    return UnitPlan(name=f"shared {path}", changes=changes, compares=[], root=root, shared=path, standalone=standalone)


def plan_orphan(path: str, root: str, observed: dict[str, tuple[str, int]], referrers: str, seen: int) -> UnitPlan:
    """Delete a shared object no key references, as seen at revision `seen`.

    Guarded by the section whose keys reference it (`referrers`: `<root>/http/routers/`): a
    writer that named it since then fails the compare, and the object stays.
    """
    changes = [Change(key, value, None) for key, (value, _mod) in sorted(observed.items())]
    compares = [Compare(referrers, "LESS", seen + 1, prefix=True)]
    return UnitPlan(
        name=f"shared {path}", changes=changes, compares=compares, root=root, removed=True, shared=path, standalone=True,
    )
