"""Each sidecar's passive observations in etcd, for the leader to decide from.

A sidecar sees only its own Traefik's traffic. It publishes its failure runs at
`<health prefix>.passive/<identity>`, attached to the lease it campaigns with, so the report
of a sidecar that died expires with it. Everyone follows the prefix; the leader adds them up.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from loguru import logger

from ..errors import EtcdError
from ..etcd.follow import follow_prefix
from ..etcd.store import EtcdStore
from ..etcd.types import KeyValue, Op, WatchEvent
from ..keys import KeyLayout

# A peer's report changed: (identity, its runs; None when the report is gone).
OnReport = Callable[[str, "list[list[Any]] | None"], None]


class PassiveReports:
    """Publishes this sidecar's report and follows everyone's."""

    def __init__(self, etcd: EtcdStore, layout: KeyLayout, identity: str, lease: Callable[[], int]) -> None:
        self._etcd = etcd
        self.prefix = f"{layout.health_prefix}.passive/"
        self.identity = identity
        self._lease = lease

    async def publish(self, runs: list[list[Any]]) -> bool:
        """Replace this sidecar's report (deleted when it has no runs); False when it could not be written."""
        lease = self._lease()
        if not lease:
            return False  # no lease yet: a report must never outlive its sidecar
        value = json.dumps({"identity": self.identity, "runs": runs}) if runs else None
        try:
            await self._etcd.txn([], [Op(self.prefix + self.identity, value, lease=lease if value else 0)])
        except EtcdError as exc:
            logger.debug("passive report not published ({})", exc.title)
            return False
        return True

    async def follow(self, on_report: OnReport) -> None:
        """Call `on_report` for every report now there and every later change (list, then watch; re-list after a failure)."""
        known: set[str] = set()

        def listed(kvs: list[KeyValue]) -> None:
            now = {kv.key[len(self.prefix) :]: kv.value for kv in kvs}
            for identity in known - now.keys():
                on_report(identity, None)
            known.clear()
            known.update(now)
            for identity, value in now.items():
                on_report(identity, _runs(value))

        def changed(events: list[WatchEvent]) -> None:
            for event in events:
                identity, value = event.key[len(self.prefix) :], event.value
                (known.add if value is not None else known.discard)(identity)
                on_report(identity, _runs(value))

        await follow_prefix(self._etcd, self.prefix, listed, changed)


def _runs(value: str | None) -> list[list[Any]] | None:
    if value is None:
        return None
    try:
        runs = json.loads(value).get("runs", [])
    except (ValueError, AttributeError):
        logger.error("ignoring a passive report that is not a JSON object")
        return None
    return runs if isinstance(runs, list) else None
