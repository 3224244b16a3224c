"""The pacer: keys held while a root's Traefik is behind, released when it caught up or they are overdue."""

from __future__ import annotations

from exporter.keys import IngressRef
from exporter.write.pacer import Backlog, Pacer

ROOT, OTHER = "traefik/worker_a", "traefik/worker_b"
X, Y = IngressRef("a", "x"), IngressRef("a", "y")


class World:
    """Which roots' Traefik is behind, and a clock the test moves."""

    def __init__(self) -> None:
        self.behind = {ROOT: True, OTHER: False}
        self.now = 100.0

    def pacer(self, hold_max: float = 30.0) -> Pacer:
        return Pacer(self.behind.__getitem__, hold_max, clock=lambda: self.now)


def test_a_root_whose_traefik_is_behind_holds_keys_until_it_caught_up() -> None:
    world = World()
    pacer = world.pacer()
    assert pacer.enabled and pacer.paced(ROOT) and not pacer.paced(OTHER)
    pacer.hold(X, ROOT, "upsert")
    world.now += 5
    pacer.hold(X, ROOT, "health")  # held already: its first time and reason stay
    pacer.hold(Y, ROOT, "drift")
    assert pacer.holds(X) and not pacer.ready()
    assert pacer.backlog(ROOT) == Backlog(2, 5.0)
    world.behind[ROOT] = False
    assert pacer.ready() and pacer.due() == {X: "upsert", Y: "drift"}
    assert not pacer.holds(X) and pacer.backlog(ROOT) == Backlog(0, 0.0)


def test_keys_held_past_the_longest_hold_are_due_even_while_traefik_is_behind() -> None:
    world = World()
    pacer = world.pacer(hold_max=30.0)
    pacer.hold(X, ROOT, "upsert")
    world.now += 29.9
    assert pacer.paced(ROOT) and not pacer.ready()
    world.now += 0.1
    assert not pacer.paced(ROOT) and pacer.due() == {X: "upsert"}


def test_a_root_being_flushed_is_not_paced_until_the_batch_is_over() -> None:
    # Whatever else is written with the due keys goes whole: pacing it would split the batch.
    world = World()
    pacer = world.pacer()
    pacer.hold(X, ROOT, "upsert")
    world.behind[ROOT] = False
    pacer.due()
    world.behind[ROOT] = True  # the flush itself put Traefik behind again
    assert not pacer.paced(ROOT)
    pacer.flushed()
    assert pacer.paced(ROOT)


def test_released_and_cleared_keys_are_no_longer_held_and_the_gauge_reads_zero() -> None:
    world = World()
    pacer = world.pacer()
    pacer.hold(X, ROOT, "upsert")
    pacer.hold(Y, ROOT, "upsert")
    pacer.release([X])
    assert not pacer.holds(X) and pacer.holds(Y) and pacer.counts() == [((ROOT,), 1.0)]
    pacer.clear()  # leadership lost
    assert not pacer.holds(Y) and pacer.counts() == [((ROOT,), 0.0)]


def test_without_a_traefik_to_pace_to_nothing_is_ever_paced() -> None:
    pacer = Pacer(None, 30.0)
    assert not pacer.enabled and not pacer.paced(ROOT) and pacer.counts() == []
