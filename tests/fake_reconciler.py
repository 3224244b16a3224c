"""The reconciler on the in-memory etcd, as the unit tests of its decisions run it: a layout, a
switchable leader, an elected etcd, and a running reconciler."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence

from exporter.etcd.store import EtcdStore
from exporter.etcd.types import Compare
from exporter.keys import IngressRef, KeyLayout
from exporter.plan.planner import Planner
from exporter.reconcile import Cadence, Collaborators, Reconciler
from exporter.render.renderer import Renderer
from exporter.render.root_keys import DefaultCertificate
from exporter.roles import Ejections
from tests.fake_etcd import FakeEtcd
from tests.helpers import AUTHORITY, eventually

LAYOUT = KeyLayout("traefik/worker_{authority}", "records")
ROOT = LAYOUT.root(AUTHORITY)
CERT = DefaultCertificate("CERT", "KEY", generated=True)
UP = {"servers": [{"url": "http://10.0.0.5:8000"}]}
FENCE = Compare("records.leader", "EQUAL", 7, target="CREATE")


class Leader:
    """A leader policy the test switches."""

    def __init__(self, leading: bool = True) -> None:
        self.leading = leading

    def is_leader(self) -> bool:
        return self.leading

    def fence(self) -> Sequence[Compare]:
        return [FENCE] if self.leading else []


@contextlib.asynccontextmanager
async def running(
    etcd: EtcdStore, *, leader: Leader | None = None, ejections: Ejections | None = None, renderer: Renderer | None = None,
    behind: Callable[[str], bool] | None = None, pace_hold_max: float = 30.0, built: Callable[[Reconciler], None] | None = None,
    coalesce_window: float = 0.0,
) -> AsyncIterator[Reconciler]:
    planner = Planner(renderer or Renderer(LAYOUT, ["web"]), LAYOUT, CERT)
    rec = Reconciler(
        etcd=etcd, layout=LAYOUT, planner=planner, shared=Collaborators(leader=leader, ejections=ejections, behind=behind),
        cadence=Cadence(coalesce_window=coalesce_window, reconcile_interval=3600, pace_hold_max=pace_hold_max),
    )
    if built is not None:
        built(rec)
    await rec.start()
    await rec.wait_synced(5)
    try:
        yield rec
    finally:
        await rec.stop()


async def elected_etcd() -> FakeEtcd:
    """An in-memory etcd holding the election key the leader's fence compares (create_revision 7 is forced)."""
    fake = FakeEtcd()
    await fake.put("records.leader", "me")
    fake.set_create_revision("records.leader", 7)
    return fake


def rule_key(iid: str) -> str:
    return f"{ROOT}/http/routers/{AUTHORITY}_{iid}/rule"


async def until_adopted(rec: Reconciler, ref: IngressRef, revision: int, removed: bool = False) -> None:
    """Wait until the watch has brought a peer's record of `revision` (a tombstone when `removed`) into `rec`'s view."""

    async def adopted() -> bool:
        stored = rec.store.latest(ref)
        return stored is not None and stored.revision == revision and stored.removed == removed

    await eventually(adopted, timeout=1)
