"""The campaign's faults of etcd itself: a member killed, a compaction, the database quota filled
(NOSPACE under load), and a member replaced with a fresh data dir, as a StatefulSet roll with a
lost volume does it."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from exporter.etcd.types import b64

if TYPE_CHECKING:
    from .faults import Faults

FILLER = "campaign/filler"  # the recorder keeps no values under campaign/
FILLER_BYTES = 2**20
FILL_WAVE = 8


async def etcd_kill(f: Faults) -> None:
    """SIGKILL a member (the raft leader half the time), restart it after 0.5-5 s."""
    if f.member.locked():
        f.skipped["etcd-kill"] += 1
        return
    async with f.member:
        leader = f.world.raft_leader() if f.rng.random() < 0.5 else None
        member = leader or f.rng.choice(f.world.members)
        name = f"{'raft leader ' if leader else ''}{member.client_port}"
        start = f.now()
        member.proc.kill()
        await asyncio.to_thread(member.proc.wait)
        try:
            await f.hold(f.rng.uniform(0.5, 5))
        finally:
            # Back once it serves: its /health says false while a nospace fault's alarm is raised.
            await asyncio.to_thread(member.restart, 30, "/version")
            await f.record("etcd-kill", name, start)


async def compaction(f: Faults) -> None:
    """Compact up to what the recorder has read: the history stays whole."""
    start = f.now()
    await f.world.gateway(f.http, "/v3/kv/compaction", {"revision": str(f.recorder.seen)})
    await f.record("compaction", str(f.recorder.seen), start)


async def nospace(f: Faults) -> None:
    """Fill the quota until etcd raises NOSPACE, hold 1-4 s under load, then do what an operator
    does: delete, compact, defragment every member, disarm the alarm. The fault spans the alarm:
    from the put etcd refused to the moment before the disarm (rule 9 judges every 204 within)."""
    # Never beside a member's kill or replacement: defragmenting a member that is starting hangs, and
    # a starting member is not healthy until the alarm is disarmed, which waits for the defragment.
    if "quota" in f.busy or f.member.locked():
        f.skipped["nospace"] += 1
        return
    async with f.member:
        f.busy.add("quota")
        puts, raised, at = 0, f.now(), 0
        disarmed = raised
        try:
            puts = await _fill(f)
            raised, at = f.now(), await f.revision()  # no put is applied from here to the disarm
            await f.hold(f.rng.uniform(1, 4))
        finally:
            disarmed = await _free(f)
            f.busy.discard("quota")
            await f.record("nospace", f"{puts} puts of 1 MiB", raised, end=disarmed, start_revision=at)


async def _fill(f: Faults) -> int:
    # Puts in waves of FILL_WAVE: one at a time, each 1 MiB through raft and three fsyncs, the
    # quota took about 10 s to fill, a whole CI defect run.
    value = b64("x" * FILLER_BYTES)
    for wave in range(400 // FILL_WAVE):
        answers = await asyncio.gather(*(f.world.gateway(f.http, "/v3/kv/put", {"key": b64(f"{FILLER}/{n}"), "value": value})
                                         for n in range(FILL_WAVE)))
        if any("database space exceeded" in str(a.get("error") or a.get("message") or "") for a in answers):
            return (wave + 1) * FILL_WAVE
    raise RuntimeError(f"etcd took 400 MiB without raising NOSPACE: is --quota-backend-bytes set? see {f.world.workdir}")


async def _free(f: Faults) -> float:
    """Free the space and disarm the alarm; returns the time just before the disarm."""
    answer = await f.world.gateway(f.http, "/v3/kv/deleterange", {"key": b64(FILLER + "/"), "range_end": b64(FILLER + "0")})
    deleted_at = int(answer["header"]["revision"])
    await f.recorder.until(deleted_at, 30)  # compacted only once read: the history stays whole
    await f.world.gateway(f.http, "/v3/kv/compaction", {"revision": str(deleted_at), "physical": True})
    return await f.world.defragment_and_disarm(f.http) - f.started


async def member_replace(f: Faults) -> None:
    """`member remove`, a fresh data dir, `member add`: the new member catches up from its peers."""
    if f.member.locked():
        f.skipped["member-replace"] += 1
        return
    async with f.member:
        index = f.rng.randrange(len(f.world.members))
        start = f.now()
        try:
            await f.world.replace_member(f.http, index)
        finally:
            await f.record("member-replace", str(f.world.members[index].client_port), start)
