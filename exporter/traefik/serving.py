"""What the push API tells about serving: each stored ingress's status, and `?wait=served`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import TemplateError
from ..keys import IngressRef, KeyLayout
from ..store.records import Record
from ..write.ledger import CommitLedger
from .observer import TraefikObserver


class Serving:
    """Answers from the commit ledger (what is committed) and the observer (what Traefik serves; None: unknown)."""

    def __init__(
        self, layout: KeyLayout, ledger: CommitLedger, render_errors: Callable[[], Mapping[IngressRef, TemplateError]],
        observer: TraefikObserver | None, timeout: float, pending: Callable[[IngressRef], bool] = lambda _ref: False,
    ) -> None:
        """`pending`: whether an ingress's record committed while its keys are held (write/pacer.py)."""
        self._layout = layout
        self._pending = pending
        self._ledger = ledger
        self._render_errors = render_errors
        self._observer = observer
        self._timeout = timeout

    @property
    def can_wait(self) -> bool:
        """True when there is a Traefik to ask (`traefik.api_url`)."""
        return self._observer is not None

    def committed_revision(self, ref: IngressRef) -> int:
        """The etcd revision of the ingress's last commit (the last part of a split one), 0 when it has none."""
        return self._ledger.revision_of(ref)

    def status(self, record: Record) -> dict[str, Any]:
        """`{"committed_revision", "pending", "served", "errors"}`; `served` is None without a Traefik to ask.

        `pending`: the record is committed and its keys wait for Traefik to apply the previous commit.
        """
        ref = record.key
        committed = self.committed_revision(ref)
        pending = self._pending(ref)
        errors = []
        if (error := self._render_errors().get(ref)) is not None:
            errors.append(f"not written: {error.title}")
        served: bool | None = None
        if self._observer is not None:
            served = not pending and self._observer.served(self._layout.root(ref.authority), committed)
            for router in self._observer.router_errors_of(ref):
                detail = "; ".join(router["errors"]) or "no error text"
                errors.append(f"router {router['router']} is {router['status']} in Traefik: {detail}")
        return {"committed_revision": committed, "pending": pending, "served": served, "errors": errors}

    async def wait(self, refs: Iterable[IngressRef]) -> None:
        """Until Traefik serves the committed state of `refs` (removals: no longer serves them); NotServedInTime."""
        observer = self._observer
        if observer is None:
            return
        refs = list(refs)
        deadline = time.monotonic() + self._timeout
        # Keys held by the pacer first: until they are written there is no revision to wait for.
        if not await observer.wait_until(lambda: not any(self._pending(r) for r in refs), self._timeout):
            waiting = [r for r in refs if self._pending(r)]
            if waiting:
                raise observer.not_served(self._layout.root(waiting[0].authority), 0, len(waiting))
        targets: dict[str, int] = {}
        for ref in refs:
            revision = self.committed_revision(ref)
            if revision:
                root = self._layout.root(ref.authority)
                targets[root] = max(targets.get(root, 0), revision)
        if targets:
            await observer.wait_served(targets, max(0.0, deadline - time.monotonic()))
