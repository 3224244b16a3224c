"""The plan: what must change in etcd, computed without side effects, printable, then applied.

`diff`, `run --dry-run` and the writer share these types, so what operators read is exactly
what the writer applies. Each unit is one ingress (or one root's own keys) with the compares
that guard it (plan/guards.py); plan/diff.py computes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ..etcd.types import Compare
from ..keys import IngressRef
from ..store.records import Record


class Change(NamedTuple):
    """One key change: `old` None means added, `new` None means removed."""

    key: str
    old: str | None
    new: str | None

    @property
    def sign(self) -> str:
        """`+`, `-` or `~`."""
        return "+" if self.old is None else "-" if self.new is None else "~"


@dataclass(slots=True)
class UnitPlan:
    """The changes of one ingress (`owner` set), of one root's own keys, or of one shared object (`owner` None).

    `changes` are in a safe order for splitting: router deletes, other puts, router puts,
    other deletes (so no router ever references a missing object), with the record placed
    as the commit rule says (plan/guards.py: its put first, its delete last).
    """

    name: str
    changes: list[Change]
    compares: list[Compare]
    owner: IngressRef | None = None
    # The owner's record key (what its record guard compares); empty for a root's own keys.
    record_key: str = ""
    record: Record | None = None
    removed: bool = False
    # The root the unit's keys are under (its transactions rewrite that root's beacon); empty
    # for a record committed alone (write/pacer.py), which writes nothing under the root.
    root: str = ""
    # A record committed alone whose key changes were held back for later.
    keys_held: bool = False
    # The shared objects (path, witness key) the ingress's keys newly reference: each exists when
    # the reference commits (written in the same transaction, or compared present).
    needs: tuple[tuple[str, str], ...] = ()
    # For a shared object's unit (owner None): its path. Written with the first unit that needs
    # it, unless `standalone` (a repair of one in use, or an orphan's deletion).
    shared: str = ""
    standalone: bool = False


@dataclass(slots=True)
class Plan:
    """Every unit that differs, the foreign keys seen under managed roots, and the etcd revision
    of the mirror it was made against (docs/writer.md, "The mirror")."""

    units: list[UnitPlan] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    revision: int = 0

    @property
    def empty(self) -> bool:
        """True when nothing needs writing."""
        return not self.units

    def changes(self) -> list[Change]:
        """Every change of every unit, in plan order."""
        return [c for unit in self.units for c in unit.changes]
