"""The observer's states from what a (fake) Traefik API shows: converged, pending, frozen, unreachable."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from exporter.errors import NotServedInTime, TraefikUnreachable
from exporter.keys import IngressRef, KeyLayout
from exporter.render.root_keys import beacon_value
from exporter.store.observed import Observed
from exporter.store.records import RecordStore
from exporter.traefik.api import TraefikApi
from exporter.traefik.observer import TraefikObserver
from tests.helpers import eventually, record

LAYOUT = KeyLayout()
ROOT = LAYOUT.root("test")
MAX_LAG = 0.3


class FakeApi(TraefikApi):
    """Shows whatever beacon the test sets; `down` makes it unreachable."""

    def __init__(self) -> None:
        super().__init__("http://traefik.test")
        self.shown: str | None = None
        self.down = False
        self.polls = 0

    async def beacon(self) -> str | None:
        self.polls += 1
        if self.down:
            raise TraefikUnreachable("Traefik's API at http://traefik.test does not answer: ClientConnectorError")
        return self.shown

    async def broken_routers(self) -> list[dict[str, Any]]:
        return []


class World:
    def __init__(self) -> None:
        self.api = FakeApi()
        self.observed = Observed(LAYOUT)
        self.store = RecordStore()
        self.store.set(IngressRef("test", "a"), record("a", upstream={"servers": [{"url": "http://10.0.0.5:80"}]}))
        self.observer = TraefikObserver(self.api, LAYOUT, self.observed, self.store, max_lag=MAX_LAG, poll_interval=0.05)

    def commit(self, token: str, revision: int) -> str:
        value = beacon_value(ROOT, token)
        self.observed.set(LAYOUT.beacon_key(ROOT), value, revision)
        return value

    async def state(self, state: str) -> bool:
        return [(v.root, v.state) for v in self.observer.roots()] == [(ROOT, state)]


@pytest.fixture
async def world() -> AsyncIterator[World]:
    w = World()
    task = asyncio.create_task(w.observer.run())
    yield w
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_converged_when_traefik_shows_the_newest_beacon(world: World) -> None:
    world.api.shown = world.commit("w.1", 10)
    await eventually(lambda: world.state("converged"))
    [view] = world.observer.roots()
    assert (view.committed_revision, view.applied_revision, view.lag_seconds) == (10, 10, 0.0)
    assert view.to_json()["apply_seconds"] is None  # what it applied before we looked is not timed
    assert world.observer.served(ROOT, 10) and not world.observer.served(ROOT, 11)
    assert world.observer.readiness() == []


async def test_behind_is_pending_then_frozen_with_the_blocking_key_named(world: World) -> None:
    world.api.shown = world.commit("w.1", 10)
    await eventually(lambda: world.state("converged"))
    world.commit("w.2", 12)
    bad = f"{ROOT}/http/routers/other/priority"
    world.observed.set(bad, "abc", 11)
    await eventually(lambda: world.state("pending"))
    await eventually(lambda: world.state("frozen"), timeout=MAX_LAG + 3)
    [view] = world.observer.roots()
    assert (view.committed_revision, view.applied_revision) == (12, 10) and view.lag_seconds > MAX_LAG
    assert view.blocking_keys == [bad]
    assert world.observer.readiness() == [f"traefik frozen on {ROOT}: blocked by key {bad}"]
    world.api.shown = beacon_value(ROOT, "w.2")
    await eventually(lambda: world.state("converged"))
    assert world.observer.readiness() == []


async def test_unreachable_traefik_turns_readiness_503_only_after_max_lag(world: World) -> None:
    world.api.shown = world.commit("w.1", 10)
    await eventually(lambda: world.state("converged"))
    went_down = time.monotonic()
    world.api.down = True
    await eventually(lambda: world.state("unreachable"), interval=0.01)
    reasons = world.observer.readiness()
    if time.monotonic() - went_down < MAX_LAG:  # a stalled machine can take longer to get here
        assert reasons == [], "unreachable for less than max_lag: still ready"
    await eventually(lambda: _reasons(world, ["traefik unreachable"]), timeout=MAX_LAG + 3)
    world.api.down = False
    await eventually(lambda: world.state("converged"))


async def test_a_traefik_serving_another_root_reports_none_of_ours(world: World) -> None:
    world.commit("w.1", 10)
    await eventually(lambda: world.state("pending"))  # ours, while Traefik shows nothing yet
    world.api.shown = beacon_value("traefik/worker_other", "x.9")
    polls = world.api.polls
    await eventually(lambda: _polled(world, polls + 2))
    assert world.observer.roots() == []
    assert not world.observer.behind(ROOT), "a Traefik that reads another root holds nothing of ours"


async def test_a_traefik_that_has_shown_no_beacon_yet_is_behind_until_it_applies_the_root(world: World) -> None:
    # A fresh root: what is written while Traefik applies its first commit waits for that commit.
    world.commit("w.1", 10)
    await eventually(lambda: world.state("pending"))
    assert world.observer.behind(ROOT)
    world.api.shown = beacon_value(ROOT, "w.1")
    await eventually(lambda: world.state("converged"))
    assert not world.observer.behind(ROOT)
    world.commit("w.2", 12)
    await eventually(lambda: world.state("pending"))
    assert world.observer.behind(ROOT)


def test_a_root_written_since_the_last_check_is_behind_at_once() -> None:
    # The bulk's second request can come before the observer has checked Traefik after the first commit.
    w = World()
    w.commit("w.1", 10)
    assert w.observer.roots() == [] and w.observer.behind(ROOT)


async def test_a_root_only_another_writer_wrote_is_behind_by_what_traefik_shows() -> None:
    # No record of this sidecar's there yet, so no view of the root: Traefik's beacon still decides.
    w = World()
    observer = TraefikObserver(w.api, LAYOUT, w.observed, RecordStore(), max_lag=MAX_LAG, poll_interval=0.05)
    task = asyncio.create_task(observer.run())
    try:
        w.api.shown = w.commit("other.1", 10)
        polls = w.api.polls
        await eventually(lambda: _polled(w, polls + 2))
        assert observer.roots() == [] and not observer.behind(ROOT)
        w.commit("other.2", 12)
        assert observer.behind(ROOT)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_traefik_that_shows_no_beacon_for_max_lag_reads_none_of_our_roots(world: World) -> None:
    world.commit("w.1", 10)
    await eventually(lambda: world.state("pending"))
    assert world.observer.behind(ROOT)
    await eventually(lambda: world.state("frozen"), timeout=MAX_LAG + 3)
    assert not world.observer.behind(ROOT), "it reads none of ours: nothing is held for it"
    other = IngressRef("second", "b")
    world.store.set(other, record("b", authority="second", upstream={"servers": [{"url": "http://10.0.0.6:80"}]}))
    world.observed.set(LAYOUT.beacon_key(LAYOUT.root("second")), beacon_value(LAYOUT.root("second"), "w.3"), 13)
    polls = world.api.polls
    await eventually(lambda: _polled(world, polls + 2))
    assert not world.observer.behind(LAYOUT.root("second")), "a root written later is not held either"


async def test_wait_served_times_out_with_how_far_traefik_got(world: World) -> None:
    world.api.shown = world.commit("w.1", 10)
    world.commit("w.2", 12)
    with pytest.raises(NotServedInTime) as info:
        await world.observer.wait_served({ROOT: 12}, timeout=0.3)
    data = info.value.data
    assert (data["committed_revision"], data["applied_revision"], data["blocking_keys"]) == (12, 10, [])
    assert data["state"] in ("pending", "frozen")  # frozen once MAX_LAG has passed on a slow machine
    world.api.shown = beacon_value(ROOT, "w.2")
    await world.observer.wait_served({ROOT: 12}, timeout=2)


async def _reasons(world: World, reasons: list[str]) -> bool:
    return world.observer.readiness() == reasons


async def _polled(world: World, polls: int) -> bool:
    return world.api.polls >= polls


async def test_the_api_client_uses_basic_auth_and_reads_the_beacon_case_insensitively() -> None:
    from aiohttp import web

    from exporter.embedded import free_port

    async def beacon(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Basic b3BzOnMzY3JldA==":  # ops:s3cret
            return web.Response(status=401)
        return web.json_response({"headers": {"customRequestHeaders": {"x-exporter-beacon": "traefik/worker_test w.3"}}})

    app = web.Application()
    app.router.add_get("/api/http/middlewares/exporter-beacon@etcd", beacon)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    good = TraefikApi(f"http://127.0.0.1:{port}", username="ops", password="s3cret")
    wrong = TraefikApi(f"http://127.0.0.1:{port}", username="ops", password="wrong")
    try:
        assert await good.beacon() == "traefik/worker_test w.3"
        with pytest.raises(TraefikUnreachable) as info:
            await wrong.beacon()
        assert "HTTP 401" in info.value.title and "wrong" not in info.value.title
    finally:
        await good.close()
        await wrong.close()
        await runner.cleanup()


async def test_the_time_traefik_takes_to_apply_each_commit_is_measured(world: World) -> None:
    world.api.shown = world.commit("w.1", 10)
    await eventually(lambda: world.state("converged"))
    for n, hold in enumerate((0.2, 0.4, 0.0), start=2):
        committed = world.commit(f"w.{n}", 10 + n)
        await eventually(lambda: world.state("pending"), interval=0.01)
        await asyncio.sleep(hold)  # Traefik taking its time: the behaviour measured, not a synchronisation
        world.api.shown = committed
        await eventually(lambda: world.state("converged"), interval=0.01)
    [view] = world.observer.roots()
    applies = list(view.applies)
    assert len(applies) == 3 and applies[0] >= 0.2 and applies[1] >= 0.4 and applies[2] < 0.2, applies
    assert view.to_json()["apply_seconds"] == {"last": round(applies[2], 3), "median": round(applies[0], 3)}
