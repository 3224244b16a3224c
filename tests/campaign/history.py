"""What a campaign records and its checker reads: requests, faults, looks, the etcd history, the end state."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


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
    batch: int = 0  # requests of one call share it (0: alone); a call answers for all its ingresses at once
    refused_by: int | None = None  # a 409's `stored_revision`
    sidecar: str = ""  # the one it was sent to
    content: str = ""  # an upsert's `content_of` (a stale one reuses a revision with other content)


@dataclass(frozen=True)
class Fault:
    """One fault as it happened: what, on whom, how, from when to when (seconds into the run), and
    etcd's revision once it had healed."""

    kind: str
    target: str
    start: float
    end: float
    mode: str = ""
    revision: int = 0
    start_revision: int = 0  # etcd's revision once it was in effect (0: not taken)


@dataclass(frozen=True)
class Look:
    """One look at a sidecar while the faults run: its /readyz and its /v1/mirror's revision (0: no answer)."""

    at: float
    sidecar: str
    ready: int
    reasons: str
    mirror_revision: int


@dataclass(frozen=True)
class Stored:
    """What etcd holds for an ingress at the end: its record's revision, whether it is a tombstone,
    whether a Traefik serves its root, and what its servers answer (their names)."""

    revision: int
    removed: bool = False
    served: bool = True
    bodies: frozenset[str] = frozenset()
    content: str = ""  # a live record's `content_of` ("": not read)


def content_of(ingress: Mapping[str, Any]) -> str:
    """What tells the campaign's upserts of one ingress apart, the same from a pushed body and from
    the record etcd holds: its servers and its allowlist."""
    servers = sorted(s["url"] for s in ingress.get("upstream", {}).get("servers", []))
    return json.dumps([servers, ingress.get("allowed_client_ips") or []])


def definite(status: int) -> bool:
    """An answer that says what happened: 2xx or 4xx. Without one (0: no answer, 5xx) a request may have committed."""
    return 200 <= status < 500


@dataclass
class History:
    """Everything the checker reads."""

    requests: list[Request] = field(default_factory=list)
    final: dict[str, Stored] = field(default_factory=dict)
    # etcd revisions in order: each the keys it put (value) or deleted (None)
    etcd: list[tuple[int, dict[str, str | None]]] = field(default_factory=list)
    roots: list[str] = field(default_factory=list)
    records_prefix: str = ""
    diff_exit: dict[str, int] = field(default_factory=dict)  # roots -> `diff` exit code
    served: dict[str, dict[str, tuple[int, str]]] = field(default_factory=dict)  # traefik -> host -> (status, body)
    ready: dict[str, int] = field(default_factory=dict)  # sidecar -> /readyz status
    leading: dict[str, bool] = field(default_factory=dict)  # sidecar -> leads
    rss: dict[str, list[float]] = field(default_factory=dict)  # sidecar -> MB samples, in order
    rss_growth_bound: float = 100.0
    # `/v1/mirror` samples: (sidecar, revision, its digest, the digest of etcd read at that revision)
    mirrors: list[tuple[str, int, str, str]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    looks: list[Look] = field(default_factory=list)  # each sidecar's /readyz and /v1/mirror revision, while the faults ran
    leader_ttl: float = 3.0
    election_key: str = ""
    election_holder: str | None = None  # the election key's value where `etcd` starts
    health_prefix: str = ""
    mirror_prefixes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Violation:
    """One broken rule: which, about what, and the history that shows it."""

    rule: int
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"rule {self.rule} ({self.subject}): {self.detail}"
