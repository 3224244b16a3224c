"""The simulation as CI runs it: a few hundred seeds find nothing, every planted defect is caught (docs/simulation.md)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from .defects import DEFECTS
from .run import run_seed
from .shards import DEFECTS as SHARD_DEFECTS
from .shards import FOUND_AT, planted, run_shard_seed

# Seeds every run takes, then as many from a start drawn anew each run (printed, to replay).
FIXED = range(1, 101)
RANDOM = 100
CAUGHT_WITHIN = 200


def test_a_few_hundred_seeds_find_nothing() -> None:
    start = random.SystemRandom().randrange(1000, 2**31)
    print(f"simulation seeds 1-100 and {start}-{start + RANDOM - 1}: replay one with python -m tests.simulation --seeds 1 --start SEED")
    for seed in [*FIXED, *range(start, start + RANDOM)]:
        failure = run_seed(seed)
        assert failure is None, f"seed {seed}, step {failure.step}: {failure.invariant}: {failure.detail}"


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_every_planted_defect_is_caught(defect: str) -> None:
    with DEFECTS[defect]():
        found = next(((seed, f) for seed in range(1, CAUGHT_WITHIN + 1) if (f := run_seed(seed)) is not None), None)
    assert found is not None, f"{defect} not caught in {CAUGHT_WITHIN} seeds"
    # and the tree without it finds nothing at that seed
    assert run_seed(found[0]) is None


def test_a_failure_names_the_invariant_the_seed_and_the_step_and_replays_exactly() -> None:
    command = [sys.executable, "-m", "tests.simulation", "--seeds", "1", "--start", "1", "--plant", "revision-out-of-order"]
    runs = [subprocess.run(command, capture_output=True, text=True, timeout=120) for _ in range(2)]
    assert [r.returncode for r in runs] == [1, 1]
    first, replay = runs[0].stdout.splitlines()[:2]
    assert first.startswith("FAILED seed 1, step ") and ": " in first
    assert replay == "replay: python -m tests.simulation --seeds 1 --start 1 --plant revision-out-of-order"
    assert runs[1].stdout == runs[0].stdout
    listed = subprocess.run([sys.executable, "-m", "tests.simulation", "--list-defects"], capture_output=True, text=True, check=True)
    assert listed.stdout.split() == list(DEFECTS)
    clean = subprocess.run(command[:7], capture_output=True, text=True, timeout=120)
    assert clean.returncode == 0 and clean.stdout.startswith("1 seeds from 1: nothing found")


def test_shard_moves_a_few_hundred_seeds_find_nothing() -> None:
    start = random.SystemRandom().randrange(1000, 2**31)
    print(f"shard moves: seeds 1-50 and {start}-{start + 49}")
    for seed in [*range(1, 51), *range(start, start + 50)]:
        failure = run_shard_seed(seed)
        assert failure is None, f"shard moves, seed {seed}, step {failure.step}: {failure.invariant}: {failure.detail}"


@pytest.mark.parametrize("defect", sorted(SHARD_DEFECTS))
def test_every_planted_shard_defect_is_caught(defect: str) -> None:
    with planted(defect):
        seeds = [FOUND_AT[defect]] if defect in FOUND_AT else range(1, CAUGHT_WITHIN + 1)
        found = next((seed for seed in seeds if run_shard_seed(seed) is not None), None)
    assert found is not None, f"{defect} not caught in {CAUGHT_WITHIN} seeds"
    assert run_shard_seed(found) is None
