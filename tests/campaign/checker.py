"""The fault campaign's checker: a recorded history in, violations out (pure: no I/O, no clock).

A campaign records every request with its invocation and completion time and its answer, the
etcd history of the records and of one root, and what it saw at the end (each root's `diff`,
what each Traefik served, each sidecar's readiness and leadership, RSS samples). Each rule is
a sentence, and a violation names the ingress and the slice of the history that breaks it:

1. Nothing acknowledged is lost, nothing older wins: every upsert and every remove with a revision
   answered 204 is stored with a revision at least its own, at the end and already before any
   request sent after its answer was stored (a 204 means durable, not merely queued: an
   acknowledged remove at R refuses every later upsert at or below R); the final revision of every
   ingress is the highest one acknowledged for it, or that of a request that got no definite
   answer (a timeout, a 5xx: it may have committed); an ingress whose highest acknowledged change
   is a remove is removed at its revision (a remove wins a tie); a live record was written by an
   upsert of its revision, a tombstone by a remove, and a live record at the highest acknowledged
   revision has the content of an upsert acknowledged at it.
   Every request draws a revision of its own, so a stored revision names its request; a stale one
   reuses a revision with other content, so an upsert's content (its servers and allowlist) names it too.
2. No 409 without cause: a stale-revision answer for revision r of an ingress came after some
   other request with a revision >= r for it had been sent, one that etcd stored at some point,
   that got no definite answer, or whose revision the 409 names as the one it was refused
   against (requests are checked against the newest accepted revision, pending or committed:
   a pending one may fail afterwards); a remove without a revision counts as one of the
   stored revision the 409 names, which its tombstone may have taken.
3. History: at no etcd revision does a router refer to a missing service, middleware or
   transport, and no record's revision ever decreases.
4. `diff` finds nothing on any root at the end.
5. Every Traefik serves exactly the final set: every live host answered 200 from one of its
   servers, every removed host 404.
6. Every sidecar is ready and exactly one leads.
7. No sidecar's RSS grew by more than the bound across the run.
8. Every `/v1/mirror` sample equals etcd read at the sample's revision.

Rules 9 to 12, on the faults of links, disks and membership, are in fault_rules.py.
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from tests.replay import dangling, owner_of, touched_views

from . import fault_rules
from .history import Fault, History, Look, Request, Stored, Violation, definite

__all__ = ["Fault", "History", "Look", "Request", "Stored", "Violation", "check", "definite"]


def check(history: History) -> list[Violation]:
    """Every violation of the twelve rules in `history` (empty: it holds; rules 9 to 12: fault_rules.py)."""
    return [
        *acknowledged_kept(history.requests, history.final),
        *durable_when_answered(history.requests, history.etcd, history.records_prefix),
        *conflicts_with_cause(history.requests, stored_revisions(history.etcd, history.records_prefix)),
        *history_consistent(history.etcd, history.roots, history.records_prefix),
        *(Violation(4, root, f"diff exited {code}") for root, code in sorted(history.diff_exit.items()) if code != 0),
        *served_exactly(history),
        *ready_and_one_leader(history.ready, history.leading),
        *rss_bounded(history.rss, history.rss_growth_bound),
        *mirrors_equal_etcd(history.mirrors),
        *fault_rules.no_acknowledgement_without_quorum(history.requests, history.faults),
        *fault_rules.no_acknowledgement_without_space(history.requests, history.faults, history.etcd, history.records_prefix),
        *fault_rules.not_ready_named(history.faults, history.looks, history.leader_ttl),
        *(fault_rules.leader_documents(history.etcd, history.election_key, history.health_prefix, history.election_holder)
          if history.election_key else []),
        *fault_rules.mirrors_caught_up(history.faults, history.looks, history.etcd, history.mirror_prefixes),
    ]


def _slice(requests: Iterable[Request]) -> str:
    return "; ".join(f"{r.client} {r.op} rev {r.revision} [{r.invoked:.3f}-{r.completed:.3f}] -> {r.status}"
                     f"{f' (stored {r.refused_by})' if r.refused_by is not None else ''}" for r in requests)


def _by_ingress(requests: Iterable[Request]) -> dict[str, list[Request]]:
    out: dict[str, list[Request]] = defaultdict(list)
    for request in requests:
        out[request.ingress].append(request)
    return out


def acknowledged_kept(requests: Sequence[Request], final: Mapping[str, Stored]) -> list[Violation]:
    """Rule 1."""
    out = []
    for ingress, mine in sorted(_by_ingress(requests).items()):
        acked = [r for r in mine if r.status == 204 and r.revision is not None]
        stored = final.get(ingress)
        if stored is None:
            if acked:
                out.append(Violation(1, ingress, f"revision {max(r.revision or 0 for r in acked)} acknowledged, "
                                                 f"nothing stored: {_slice(acked)}"))
            continue
        lost = [r for r in acked if stored.revision < (r.revision or 0)]
        if lost:
            out.append(Violation(1, ingress, f"changes acknowledged and lost, stored {stored.revision}: {_slice(lost)}"))
        writers = [r for r in mine if r.revision == stored.revision]
        highest = max((r.revision or 0 for r in acked), default=0)
        removed_last = [r for r in acked if r.op == "remove" and r.revision == highest]
        if removed_last and stored.revision == highest and not stored.removed:
            detail = f"live at revision {highest}, which an acknowledged remove removed: {_slice(removed_last)}"
            out.append(Violation(1, ingress, detail))
        if stored.revision > highest and all(definite(r.status) for r in writers):
            detail = f"stored revision {stored.revision} above the highest acknowledged {highest}, " \
                     f"and every request of it was answered: {_slice(writers)}"
            out.append(Violation(1, ingress, detail))
        at_stored = [r for r in acked if r.op == "upsert" and r.revision == stored.revision]
        if stored.content and at_stored and not stored.removed and all(r.content != stored.content for r in at_stored):
            out.append(Violation(1, ingress, f"revision {stored.revision} acknowledged with other content than etcd holds "
                                             f"{stored.content}: {_slice(at_stored)}"))
        op = "remove" if stored.removed else "upsert"
        # A remove without a revision leaves a tombstone at the revision it removed.
        bare_remove = stored.removed and any(r.op == "remove" and r.revision is None for r in mine)
        if not any(r.op == op for r in writers) and not bare_remove:
            out.append(Violation(1, ingress, f"stored a {'tombstone' if stored.removed else 'live record'} at revision "
                                             f"{stored.revision}, which no {op} carried: {_slice(writers)}"))
    return out


def durable_when_answered(
    requests: Sequence[Request], events: Sequence[tuple[int, dict[str, str | None]]], records_prefix: str
) -> list[Violation]:
    """Rule 1, in the history: an upsert or a remove of revision r answered 204 at time t was durable
    at t, so etcd held a record of revision >= r before it first stored any revision that only
    requests sent after t carried (an older upsert sent after an acknowledged remove never wins)."""
    first_stored: dict[str, dict[int, int]] = defaultdict(dict)  # ingress -> record revision -> first etcd revision
    highest_by: dict[str, list[tuple[int, int]]] = defaultdict(list)  # ingress -> (etcd revision, highest record revision so far)
    for etcd_revision, changes in events:
        for key, value in changes.items():
            if value is None or not records_prefix or not key.startswith(records_prefix + "/"):
                continue
            ingress, revision = key[len(records_prefix) + 1 :], json.loads(value)["ingress"]["revision"]
            first_stored[ingress].setdefault(revision, etcd_revision)
            so_far = highest_by[ingress]
            so_far.append((etcd_revision, max(revision, so_far[-1][1] if so_far else -1)))
    out = []
    for ingress, mine in sorted(_by_ingress(r for r in requests if r.revision is not None).items()):
        first_sent: dict[int, float] = {}
        for request in mine:
            first_sent[request.revision or 0] = min(first_sent.get(request.revision or 0, request.invoked), request.invoked)
        stored = first_stored.get(ingress, {})
        so_far = highest_by.get(ingress, [])
        for acked in (r for r in mine if r.status == 204):
            later = [stored[q] for q, sent in first_sent.items() if sent > acked.completed and q in stored]
            if not later:
                continue
            before = bisect.bisect_left(so_far, (min(later), -1))
            if before == 0 or so_far[before - 1][1] < (acked.revision or 0):
                detail = (f"{acked.op} of revision {acked.revision} answered 204 at {acked.completed:.3f}, but etcd stored no revision "
                          f">= it before etcd revision {min(later)}, written by a request sent after that answer")
                out.append(Violation(1, ingress, detail))
    return out


def stored_revisions(events: Sequence[tuple[int, dict[str, str | None]]], records_prefix: str) -> dict[str, set[int]]:
    """Every revision etcd held at some point for each ingress's record."""
    seen: dict[str, set[int]] = defaultdict(set)
    for _revision, changes in events:
        for key, value in changes.items():
            if value is not None and records_prefix and key.startswith(records_prefix + "/"):
                seen[key[len(records_prefix) + 1 :]].add(json.loads(value)["ingress"]["revision"])
    return seen


def conflicts_with_cause(requests: Sequence[Request], stored: Mapping[str, set[int]]) -> list[Violation]:
    """Rule 2 (a call of several ingresses is refused as a whole: one caused 409 among them is enough)."""
    by_ingress = _by_ingress(requests)

    def caused_by(r: Request, answer: Request, revision: int) -> bool:
        if r is answer or r.invoked > answer.completed:
            return False
        if r.revision is None:
            # A remove without a revision takes the one stored when it is applied (a request's
            # own included, committed while its reply was lost): the 409 names it.
            named = answer.refused_by
            return r.op == "remove" and named is not None and named >= revision and named in stored.get(answer.ingress, ())
        return r.revision >= revision and (
            r.revision in stored.get(answer.ingress, ()) or not definite(r.status) or r.revision == answer.refused_by
        )

    def caused(answer: Request) -> bool:
        revision = answer.revision
        return revision is None or any(caused_by(r, answer, revision) for r in by_ingress[answer.ingress])

    batches: dict[int, list[Request]] = defaultdict(list)
    for request in requests:
        if request.status == 409:
            batches[request.batch or -id(request)].append(request)
    out: list[Violation] = []
    for refused in batches.values():
        if not any(caused(answer) for answer in refused):
            out.extend(Violation(2, a.ingress, f"409 for revision {a.revision} with no request of that revision or newer "
                                               f"sent before it that etcd stored, got no answer or the 409 names: {_slice([a])}")
                       for a in refused)
    return out


def history_consistent(events: Sequence[tuple[int, dict[str, str | None]]], roots: Sequence[str], records_prefix: str) -> list[Violation]:
    """Rule 3: replay the etcd history revision by revision; each revision is checked on the ingresses it touched."""
    out = []
    state: dict[str, dict[str, dict[str, str]]] = {root: defaultdict(dict) for root in roots}  # root -> owner -> keys
    record_revisions: dict[str, int] = {}
    for revision, changes in events:
        touched: set[tuple[str, str]] = set()
        for key, value in changes.items():
            if records_prefix and key.startswith(records_prefix + "/") and value is not None:
                ingress = key[len(records_prefix) + 1 :]
                stored = json.loads(value)["ingress"]["revision"]
                if stored < record_revisions.get(ingress, -1):
                    detail = f"record revision went {record_revisions[ingress]} -> {stored} at etcd revision {revision}"
                    out.append(Violation(3, ingress, detail))
                record_revisions[ingress] = stored
            root = next((r for r in roots if key.startswith(r + "/")), None)
            if root is None:
                continue
            owner = owner_of(key, root)
            touched.add((root, owner))
            if value is None:
                state[root][owner].pop(key, None)
            else:
                state[root][owner][key] = value
        for root in sorted({root for root, _owner in touched}):
            owners = {owner for r, owner in touched if r == root}
            for view in touched_views(state[root], owners):
                out.extend(Violation(3, root, f"at etcd revision {revision}: {ref}") for ref in dangling(view, root))
    return out


def served_exactly(history: History) -> list[Violation]:
    """Rule 5: `served` maps each Traefik's probed hosts (`<id>.test`) to what they answered."""
    out = []
    for traefik, answers in sorted(history.served.items()):
        for ingress, stored in sorted(history.final.items()):
            if not stored.served:
                continue
            host = f"{ingress.rsplit('/', 1)[1]}.test"
            status, body = answers.get(host, (0, ""))
            if stored.removed and status != 404:
                out.append(Violation(5, ingress, f"{traefik} answered {status} for removed {host}"))
            elif not stored.removed and (status != 200 or body not in stored.bodies):
                out.append(Violation(5, ingress, f"{traefik} answered {status} {body!r} for {host}, "
                                                 f"the final state wants 200 from one of {sorted(stored.bodies)}"))
    return out


def ready_and_one_leader(ready: Mapping[str, int], leading: Mapping[str, bool]) -> list[Violation]:
    """Rule 6."""
    out = [Violation(6, sidecar, f"/readyz answered {status}") for sidecar, status in sorted(ready.items()) if status != 200]
    leaders = sorted(s for s, leads in leading.items() if leads)
    if leading and len(leaders) != 1:
        out.append(Violation(6, "leadership", f"{len(leaders)} sidecars lead: {leaders}"))
    return out


def rss_bounded(samples: Mapping[str, Sequence[float]], bound: float) -> list[Violation]:
    """Rule 7: growth from the first sample to the largest later one."""
    return [
        Violation(7, sidecar, f"RSS grew {max(mb) - mb[0]:.0f} MB (from {mb[0]:.0f} to {max(mb):.0f}; bound {bound:.0f})")
        for sidecar, mb in sorted(samples.items())
        if mb and max(mb) - mb[0] > bound
    ]


def mirrors_equal_etcd(samples: Sequence[tuple[str, int, str, str]]) -> list[Violation]:
    """Rule 8: every `/v1/mirror` sample equals etcd read at the sample's revision."""
    return [Violation(8, sidecar, f"/v1/mirror at revision {revision} has digest {mine[:16]}, etcd read there {etcd[:16]}")
            for sidecar, revision, mine, etcd in samples if mine != etcd]
