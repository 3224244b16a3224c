"""The checker's rules for the faults of links, disks and membership (pure: no I/O, no clock).

9. A sidecar that cannot write answers no push 204 until it can again: no request sent to a
   sidecar while all its links were partitioned (cut, reset or one-way) and answered before the
   heal got 204, unless the same change had been acknowledged before it was sent (a no-op the
   sidecar answers from what it holds, which etcd held already, or a remove without a revision of
   an ingress no upsert may have stored since its last acknowledged remove); and no request sent to any
   sidecar while etcd's NOSPACE alarm was raised and answered before it was disarmed got 204,
   unless it changed nothing in what etcd held at the alarm (the same live record; for a remove, a
   tombstone at its revision or newer; for a remove without a revision, a tombstone or nothing).
10. `/readyz` names the cause within the lease TTL: a sidecar partitioned for longer than TTL + 2 s
   answers 503 with a reason naming etcd within TTL + 1 s of the cut.
11. A deposed leader writes nothing after its successor's first fenced write: every health
   document names as its leader the holder of the election key at the revision it was written.
12. After the heal of a fault on a sidecar's links, its `/v1/mirror` reaches, within 5 s (+1 s of
   sampling), the newest revision etcd held under the mirror's prefixes at the heal (and, by
   rule 8, equals etcd there), unless another fault on that sidecar or on etcd overlaps.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .history import Fault, Look, Request, Violation

LOOK_SLACK = 1.0  # seconds between two looks, and a little more
FRESH_WITHIN = 5.0
# Faults after which a sidecar's mirror is held to etcd (rule 12), and those that excuse it.
LINK_FAULTS = ("partition", "reset", "member-cut", "latency")
SIDECAR_FAULTS = ("sidecar-kill", "leader-stop", *LINK_FAULTS)
ETCD_FAULTS = ("etcd-kill", "leader-isolate", "member-replace", "nospace")


def no_acknowledgement_without_quorum(requests: Sequence[Request], faults: Sequence[Fault]) -> list[Violation]:
    """Rule 9 under partitions (`no_acknowledgement_without_space`: under NOSPACE)."""
    out = []
    for fault in (f for f in faults if f.kind == "partition"):
        for request in requests:
            if request.status != 204 or request.sidecar != fault.target:
                continue
            if not (fault.start <= request.invoked and request.completed < fault.end):
                continue
            if any(o.status == 204 and o.ingress == request.ingress and o.revision == request.revision and o.op == request.op
                   and o.completed < request.invoked for o in requests) or _nothing_to_remove(requests, request):
                continue
            out.append(Violation(9, request.ingress, f"{fault.target} partitioned ({fault.mode}) from {fault.start:.3f} to "
                                                     f"{fault.end:.3f} answered 204 to {request.op} rev {request.revision} "
                                                     f"[{request.invoked:.3f}-{request.completed:.3f}]"))
    return out


def no_acknowledgement_without_space(requests: Sequence[Request], faults: Sequence[Fault],
                                     events: Sequence[tuple[int, dict[str, str | None]]], records_prefix: str) -> list[Violation]:
    """Rule 9 under NOSPACE: the fault spans the alarm, from the put etcd refused (at etcd revision
    `start_revision`, after which no put is applied) to the moment before the disarm."""
    out = []
    for fault in (f for f in faults if f.kind == "nospace" and f.start_revision):
        held = records_at(events, records_prefix, fault.start_revision)
        for request in requests:
            if request.status != 204 or not (fault.start <= request.invoked and request.completed < fault.end):
                continue
            if _no_op(held.get(request.ingress), request):
                continue
            out.append(Violation(9, request.ingress, f"etcd out of space from {fault.start:.3f} to {fault.end:.3f}: {request.sidecar} "
                                                     f"answered 204 to {request.op} rev {request.revision} "
                                                     f"[{request.invoked:.3f}-{request.completed:.3f}], etcd holding "
                                                     f"{held.get(request.ingress)}"))
    return out


def _nothing_to_remove(requests: Sequence[Request], request: Request) -> bool:
    """A remove without a revision of an ingress no upsert may have stored since its last acknowledged
    remove (or ever): a no-op the sidecar answers from what it holds."""
    if request.op != "remove" or request.revision is not None:
        return False
    mine = [o for o in requests if o.ingress == request.ingress and o.invoked < request.invoked]
    removed = max((o.invoked for o in mine if o.op == "remove" and o.status == 204), default=-1.0)
    return not any(o.op == "upsert" and o.status in (0, 204) and o.invoked > removed for o in mine)


def records_at(events: Sequence[tuple[int, dict[str, str | None]]], records_prefix: str, at: int) -> dict[str, tuple[int, bool]]:
    """Each ingress's record in etcd at revision `at`: (its revision, a tombstone)."""
    held: dict[str, tuple[int, bool]] = {}
    for revision, changes in events:
        if revision > at:
            break
        for key, value in changes.items():
            if not records_prefix or not key.startswith(records_prefix + "/"):
                continue
            ingress = key[len(records_prefix) + 1 :]
            if value is None:
                held.pop(ingress, None)
            else:
                record = json.loads(value)
                held[ingress] = (record["ingress"]["revision"], bool(record.get("removed")))
    return held


def _no_op(held: tuple[int, bool] | None, request: Request) -> bool:
    """True when `request` changes nothing in what etcd holds (the sidecar may answer it 204 with no write)."""
    if request.op == "upsert":
        return held is not None and held == (request.revision, False)
    if request.revision is None:
        return held is None or held[1]
    return held is not None and held[1] and held[0] >= request.revision


def not_ready_named(faults: Sequence[Fault], looks: Sequence[Look], ttl: float) -> list[Violation]:
    """Rule 10."""
    out = []
    for fault in (f for f in faults if f.kind == "partition" and f.end - f.start > ttl + 2):
        within = fault.start + ttl + LOOK_SLACK
        named = [look for look in looks if look.sidecar == fault.target and fault.start <= look.at <= within
                 and look.ready == 503 and "etcd" in look.reasons]
        if not named:
            seen = [(round(look.at, 1), look.ready) for look in looks if look.sidecar == fault.target and fault.start <= look.at <= within]
            out.append(Violation(10, fault.target, f"partitioned ({fault.mode}) at {fault.start:.3f}, /readyz named no etcd cause by "
                                                   f"{within:.3f}: {seen}"))
    return out


def leader_documents(events: Sequence[tuple[int, dict[str, str | None]]], election_key: str, health_prefix: str,
                     holder: str | None) -> list[Violation]:
    """Rule 11: replay the history from `holder`, the election key's value where it starts; each
    health document written names the election key's holder then."""
    out = []
    for revision, changes in events:
        if election_key in changes:
            holder = changes[election_key]
        for key, value in changes.items():
            if value is None or not key.startswith(health_prefix + "/"):
                continue
            leader = json.loads(value).get("leader")
            if leader != holder:
                out.append(Violation(11, key.removeprefix(health_prefix + "/"), f"health document written at etcd revision {revision} "
                                                                               f"by {leader!r}, while {holder!r} held the election key"))
    return out


def mirrors_caught_up(faults: Sequence[Fault], looks: Sequence[Look], events: Sequence[tuple[int, dict[str, str | None]]],
                      prefixes: Sequence[str]) -> list[Violation]:
    """Rule 12."""
    touched = [revision for revision, changes in events if any(k.startswith(tuple(prefixes)) for k in changes)]
    out = []
    for fault in (f for f in faults if f.kind in LINK_FAULTS and f.revision):
        window = (fault.end, fault.end + FRESH_WITHIN + LOOK_SLACK)
        if any(o is not fault and o.start < window[1] and o.end > window[0] and
               (o.kind in ETCD_FAULTS or (o.kind in SIDECAR_FAULTS and o.target == fault.target)) for o in faults):
            continue
        target = max((r for r in touched if r <= fault.revision), default=0)
        seen = [look for look in looks if look.sidecar == fault.target and window[0] <= look.at <= window[1]]
        if seen and not any(look.mirror_revision >= target for look in seen):
            out.append(Violation(12, fault.target, f"{fault.kind} healed at {fault.end:.3f} (etcd at {target} under the mirror's "
                                                   f"prefixes); /v1/mirror reached only {max(look.mirror_revision for look in seen)} "
                                                   f"by {window[1]:.3f}"))
    return out
