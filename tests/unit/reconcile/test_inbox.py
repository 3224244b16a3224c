"""The inbox: what the loop is asked to do besides requests, and the one event that wakes it."""

from __future__ import annotations

import asyncio

from exporter.keys import IngressRef
from exporter.reconcile import Inbox

X, Y = IngressRef("a", "x"), IngressRef("a", "y")


def test_a_new_loop_lists_and_reconciles_everything_first() -> None:
    inbox = Inbox()
    assert inbox.full_requested and inbox.relist_requested and not inbox.dirty


def test_dirty_ingresses_keep_their_first_reason_and_are_taken_once() -> None:
    inbox = Inbox()
    inbox.mark_dirty([X], "health")
    inbox.mark_dirty([X, Y], "drift")
    inbox.redo({Y: "retry"})
    assert inbox.take_dirty() == {X: "health", Y: "drift"}
    assert not inbox.dirty and inbox.take_dirty() == {}


async def still_waiting(inbox: Inbox) -> asyncio.Task[bool]:
    """A wait on `inbox` that is still blocked 50 ms later."""
    waiting = asyncio.create_task(inbox.wait(60))
    done, _ = await asyncio.wait({waiting}, timeout=0.05)
    assert not done
    return waiting


async def test_a_poke_wakes_the_loop_and_clear_makes_the_next_wait_block() -> None:
    inbox = Inbox()
    inbox.mark_dirty([X], "health")
    async with asyncio.timeout(1):
        await inbox.wait(60)  # woken at once: something is dirty
    inbox.clear()
    waiting = await still_waiting(inbox)
    inbox.request_full()
    await asyncio.wait_for(waiting, 1)


async def test_redo_queues_for_the_next_turn_without_waking_the_loop() -> None:
    # redo is called by the loop itself, between turns: a wake-up would only spin it.
    inbox = Inbox()
    inbox.clear()
    waiting = await still_waiting(inbox)
    inbox.redo({X: "held"})
    done, _ = await asyncio.wait({waiting}, timeout=0.05)
    assert not done and inbox.dirty
    inbox.poke()
    await asyncio.wait_for(waiting, 1)


def test_a_relist_request_is_kept_until_the_loop_takes_it() -> None:
    inbox = Inbox()
    inbox.relist_requested = False
    inbox.request_full(relist=True)
    inbox.request_full()
    assert inbox.relist_requested and inbox.full_requested
