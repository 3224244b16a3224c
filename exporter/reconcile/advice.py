"""Advice logged after full passes: etcd limits that cost a large root, roots that overlap as prefixes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from loguru import logger

from ..etcd.limits import EtcdLimits
from ..keys import KeyLayout, overlapping_roots
from ..store.observed import Observed
from ..store.records import RecordStore

# etcd's own --max-txn-ops, and the root size from which it costs Traefik (docs/operations.md).
_DEFAULT_TXN_OPS = 128
_LARGE_ROOT = 1000


class Advice:
    """What an operator should change, each piece logged once."""

    def __init__(
        self, layout: KeyLayout, store: RecordStore, observed: Observed, detected: Callable[[], EtcdLimits | None]
    ) -> None:
        self._layout = layout
        self._store = store
        self._observed = observed
        self._detected = detected
        self._advised = False
        self._overlaps_told: set[tuple[str, str]] = set()

    def after_full_pass(self) -> None:
        """Log what is new to advise."""
        if not self._advised and self.limits() is not None:
            self._advised = True
        for outer, inner in self.overlapping_roots():
            if (outer, inner) not in self._overlaps_told:
                self._overlaps_told.add((outer, inner))
                logger.warning(
                    "root {} is a string prefix of root {}: Traefik watches its rootKey as a plain prefix, so every write "
                    "under {} costs the Traefik of {} a full rebuild; add a segment after the authority in root_key "
                    "(e.g. traefik/worker_{{authority}}/kv, docs/operations.md)", outer, inner, inner, outer,
                )

    def overlapping_roots(self) -> list[tuple[str, str]]:
        """The pairs of roots this exporter writes where the first is a string prefix of the second."""
        return overlapping_roots({self._layout.root(ref.authority) for ref in self._store.records})

    def limits(self) -> str | None:
        """Once synced: with etcd's default limits and a root of more than 1,000 ingresses, the flags that would help (logged)."""
        detected = self._detected()
        if detected is None or detected.max_txn_ops > _DEFAULT_TXN_OPS:
            return None
        roots = Counter(self._layout.root(ref.authority) for ref in self._store.records)
        if not roots or (largest := roots.most_common(1)[0])[1] <= _LARGE_ROOT:
            return None
        root, ingresses = largest
        keys = len(self._observed.under_root(root)) + ingresses  # and their records
        advice = (
            f"root {root} holds {ingresses} ingresses: with etcd's --max-txn-ops {detected.max_txn_ops}, writing all of "
            f"them takes {-(-keys // detected.max_txn_ops)} transactions and Traefik rebuilds the root once for each; etcd "
            f"--max-txn-ops 100000 --max-request-bytes 67108864 make it {-(-keys // 99_999)} (the cost: raft entries and gRPC "
            "messages of up to 64 MiB in etcd's memory; docs/operations.md)"
        )
        logger.warning("{}", advice)
        return advice
