"""Run the simulation: python -m tests.simulation --seeds N [--start S] [--plant DEFECT] [--list-defects]

Each seed is one run of two or three reconcilers on the in-memory etcd, on an event loop whose
clock only moves when every task waits (looptime). A run that finds nothing exits 0; a
failure exits 1 naming the invariant, the seed and the step, with the command that replays it.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

from .defects import DEFECTS
from .run import run_seed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    parser.add_argument("--start", type=int, default=1, help="the first seed")
    parser.add_argument("--plant", choices=sorted(DEFECTS), help="run with this defect planted")
    parser.add_argument("--list-defects", action="store_true", help="print the planted defects' names, one a line")
    args = parser.parse_args()
    if args.list_defects:
        print("\n".join(DEFECTS))
        return 0
    started = time.monotonic()
    with DEFECTS[args.plant]() if args.plant else contextlib.nullcontext():
        for seed in range(args.start, args.start + args.seeds):
            failure = run_seed(seed)
            if failure is not None:
                plant = f" --plant {args.plant}" if args.plant else ""
                print(f"FAILED seed {seed}, step {failure.step}: {failure.invariant}: {failure.detail}")
                print(f"replay: python -m tests.simulation --seeds 1 --start {seed}{plant}")
                return 1
    print(f"{args.seeds} seeds from {args.start}: nothing found ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
