"""What the push API tells about serving: each stored ingress's status, and `?wait=served`."""

from __future__ import annotations

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
        observer: TraefikObserver | None, timeout: float,
    ) -> None:
        self._layout = layout
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
        """`{"committed_revision", "served", "errors"}`; `served` is None without a Traefik to ask."""
        ref = record.key
        committed = self.committed_revision(ref)
        errors = []
        if (error := self._render_errors().get(ref)) is not None:
            errors.append(f"not written: {error.title}")
        served: bool | None = None
        if self._observer is not None:
            served = self._observer.served(self._layout.root(ref.authority), committed)
            for router in self._observer.router_errors_of(ref):
                detail = "; ".join(router["errors"]) or "no error text"
                errors.append(f"router {router['router']} is {router['status']} in Traefik: {detail}")
        return {"committed_revision": committed, "served": served, "errors": errors}

    async def wait(self, refs: Iterable[IngressRef]) -> None:
        """Until Traefik serves the committed state of `refs` (removals: no longer serves them); NotServedInTime."""
        if self._observer is None:
            return
        targets: dict[str, int] = {}
        for ref in refs:
            revision = self.committed_revision(ref)
            if revision:
                root = self._layout.root(ref.authority)
                targets[root] = max(targets.get(root, 0), revision)
        if targets:
            await self._observer.wait_served(targets, self._timeout)
