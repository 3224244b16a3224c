"""The fault campaign's checker: a recorded history in, violations out (pure: no I/O, no clock).

A campaign records every request with its invocation and completion time and its answer, the
etcd history of the records and of one root, and what it saw at the end (each root's `diff`,
what each Traefik served, each sidecar's readiness and leadership, RSS samples). Each rule is
a sentence, and a violation names the ingress and the slice of the history that breaks it:

1. Nothing acknowledged is lost, nothing older wins: every upsert answered 204 is stored with a
   revision at least its own, and the final revision of every ingress is the highest one any
   204 acknowledged for it.
2. No 409 without cause: a stale-revision answer for revision r of an ingress came after some
   request with a revision >= r for that ingress had been sent.
3. History: at no etcd revision does a router refer to a missing service, middleware or
   transport, and no record's revision ever decreases.
4. `diff` finds nothing on any root at the end.
5. Every Traefik serves exactly the final set: every live host answered 200, every removed host 404.
6. Every sidecar is ready and exactly one leads.
7. No sidecar's RSS grew by more than the bound across the run.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tests.replay import dangling


@dataclass(frozen=True)
class Request:
    """One request as a client saw it: what it asked, when, and what it got (status 0: no answer)."""

    client: str
    op: str  # "upsert" | "remove"
    ingress: str  # "<authority>/<id>"
    revision: int | None
    invoked: float
    completed: float
    status: int


@dataclass(frozen=True)
class Stored:
    """What etcd holds for an ingress at the end: its record's revision, and whether it is a tombstone."""

    revision: int
    removed: bool = False


@dataclass
class History:
    """Everything the checker reads."""

    requests: list[Request] = field(default_factory=list)
    final: dict[str, Stored] = field(default_factory=dict)
    # etcd revisions in order: each the keys it put (value) or deleted (None)
    etcd: list[tuple[int, dict[str, str | None]]] = field(default_factory=list)
    root: str = ""
    records_prefix: str = ""
    diff_exit: dict[str, int] = field(default_factory=dict)  # root -> `diff` exit code
    served: dict[str, dict[str, int]] = field(default_factory=dict)  # traefik -> host -> status
    ready: dict[str, int] = field(default_factory=dict)  # sidecar -> /readyz status
    leading: dict[str, bool] = field(default_factory=dict)  # sidecar -> leads
    rss: dict[str, list[float]] = field(default_factory=dict)  # sidecar -> MB samples, in order
    rss_growth_bound: float = 100.0


@dataclass(frozen=True)
class Violation:
    """One broken rule: which, about what, and the history that shows it."""

    rule: int
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"rule {self.rule} ({self.subject}): {self.detail}"


def check(history: History) -> list[Violation]:
    """Every violation of the seven rules in `history` (empty: it holds)."""
    return [
        *acknowledged_kept(history.requests, history.final),
        *conflicts_with_cause(history.requests),
        *history_consistent(history.etcd, history.root, history.records_prefix),
        *(Violation(4, root, f"diff exited {code}") for root, code in sorted(history.diff_exit.items()) if code != 0),
        *served_exactly(history),
        *ready_and_one_leader(history.ready, history.leading),
        *rss_bounded(history.rss, history.rss_growth_bound),
    ]


def _slice(requests: Iterable[Request]) -> str:
    return "; ".join(f"{r.client} {r.op} rev {r.revision} [{r.invoked:.3f}-{r.completed:.3f}] -> {r.status}" for r in requests)


def acknowledged_kept(requests: Sequence[Request], final: Mapping[str, Stored]) -> list[Violation]:
    """Rule 1."""
    out = []
    by_ingress: dict[str, list[Request]] = defaultdict(list)
    for request in requests:
        by_ingress[request.ingress].append(request)
    for ingress, mine in sorted(by_ingress.items()):
        acked = [r for r in mine if r.status == 204 and r.revision is not None]
        if not acked:
            continue
        stored = final.get(ingress)
        highest = max(acked, key=lambda r: r.revision or 0)
        if stored is None:
            if highest.op == "upsert":
                out.append(Violation(1, ingress, f"revision {highest.revision} acknowledged, nothing stored: {_slice(acked)}"))
            continue
        for request in acked:
            if request.op == "upsert" and stored.revision < (request.revision or 0):
                out.append(Violation(1, ingress, f"upsert of revision {request.revision} acknowledged, stored {stored.revision}"))
        if stored.revision != highest.revision:
            detail = f"stored revision {stored.revision}, highest acknowledged {highest.revision}: {_slice(acked)}"
            out.append(Violation(1, ingress, detail))
        # A remove without a revision removes whatever is stored: live or removed both fit then.
        elif (highest.op == "remove") != stored.removed and not any(r.op == "remove" and r.revision is None for r in mine):
            state = "removed" if stored.removed else "live"
            out.append(Violation(1, ingress, f"highest acknowledged is a {highest.op} of {highest.revision}, stored {state}"))
    return out


def conflicts_with_cause(requests: Sequence[Request]) -> list[Violation]:
    """Rule 2."""
    out = []
    for answer in requests:
        if answer.status != 409 or answer.revision is None:
            continue
        cause = [r for r in requests if r.ingress == answer.ingress and r is not answer and r.revision is not None
                 and r.revision >= answer.revision and r.invoked <= answer.completed]
        if not cause:
            out.append(Violation(2, answer.ingress, f"409 for revision {answer.revision} with no request of that revision or newer "
                                                     f"sent before it: {_slice([answer])}"))
    return out


def history_consistent(events: Sequence[tuple[int, dict[str, str | None]]], root: str, records_prefix: str) -> list[Violation]:
    """Rule 3: replay the etcd history revision by revision."""
    out = []
    kv: dict[str, str] = {}
    record_revisions: dict[str, int] = {}
    for revision, changes in events:
        for key, value in changes.items():
            if value is None:
                kv.pop(key, None)
            else:
                kv[key] = value
            if value is not None and records_prefix and key.startswith(records_prefix + "/"):
                stored = json.loads(value)["ingress"]["revision"]
                ingress = key[len(records_prefix) + 1 :]
                if stored < record_revisions.get(ingress, -1):
                    detail = f"record revision went {record_revisions[ingress]} -> {stored} at etcd revision {revision}"
                    out.append(Violation(3, ingress, detail))
                record_revisions[ingress] = stored
        if root:
            out.extend(Violation(3, root, f"at etcd revision {revision}: {ref}") for ref in dangling(kv, root))
    return out


def served_exactly(history: History) -> list[Violation]:
    """Rule 5: `served` maps each Traefik's probed hosts to the status they answered; live hosts are `<id>.test`."""
    out = []
    for traefik, answers in sorted(history.served.items()):
        for ingress, stored in sorted(history.final.items()):
            host = f"{ingress.rsplit('/', 1)[1]}.test"
            want = 404 if stored.removed else 200
            got = answers.get(host)
            if got != want:
                out.append(Violation(5, ingress, f"{traefik} answered {got} for {host}, the final state wants {want}"))
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
