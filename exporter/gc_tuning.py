"""The daemon's garbage-collector thresholds.

The daemon's heap is mostly long-lived and free of reference cycles (records, rendered keys,
the mirror of etcd), and it grows by hundreds of thousands of objects during a bulk sync.
With CPython's default thresholds (700, 10, 10) such a sync ran about five full collections,
each walking the whole heap (~130 ms apiece at 10,000 ingresses): a third of the sync's CPU.
Collecting the youngest generation every 10,000 net allocations instead of 700 leaves
short-lived garbage to reference counting, as before, and postpones full collections until
the heap has truly turned over (docs/performance.md, "Garbage collection").
"""

from __future__ import annotations

import gc

THRESHOLDS = (10_000, 10, 10)


def tune_gc() -> None:
    """Set the daemon's collector thresholds (done once, at start)."""
    gc.set_threshold(*THRESHOLDS)
