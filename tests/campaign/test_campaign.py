"""The randomized fault campaign as every CI run takes it (docs/campaign.md): 45 s at a fixed seed,
45 s at a random one (printed, to replay), and each planted defect, which it must catch."""

from __future__ import annotations

import os
import queue
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.campaign import VOID
from tests.campaign.defects import DEFECTS

pytestmark = pytest.mark.integration
FIXED_SEED = 20261201
DURATION = os.environ.get("EXPORTER_CAMPAIGN_DURATION", "45")


def campaign(workdir: Path, seed: int, duration: str, *extra: str, ports: str = "") -> subprocess.CompletedProcess[str]:
    """Run it to the end (on `ports`, LO-HI, when given); past its time, SIGTERM (it stops what it started) and fail."""
    args = [sys.executable, "-m", "tests.campaign", "--duration", duration, "--seed", str(seed), "--workdir", str(workdir), *extra]
    env = {**os.environ, "EXPORTER_STABLE_PORTS": ports} if ports else None
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=float(duration) + 300)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"the campaign did not end in time:\n{out[-8000:]}{err[-4000:]}")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def judged(workdir: Path, seed: int, duration: str, *extra: str, ports: str = "") -> tuple[int, subprocess.CompletedProcess[str]]:
    """One run at `seed`. A run in which etcd's members disagree at the end (etcd lost writes it
    acknowledged) fails: on the etcd the fixtures choose, which has no such bug, it is a finding."""
    print(f"campaign seed {seed}: replay with python -m tests.campaign --seed {seed} --duration {duration} {' '.join(extra)}")
    done = campaign(workdir / f"seed-{seed}", seed, duration, *extra, ports=ports)
    assert done.returncode != VOID, f"etcd's members disagree, seed {seed}, logs under {workdir}:\n{done.stdout[-8000:]}"
    return seed, done


@pytest.mark.parametrize("seed", [FIXED_SEED, 0], ids=["fixed-seed", "random-seed"])
def test_the_campaign_finds_nothing(tmp_path: Path, seed: int) -> None:
    seed, done = judged(tmp_path, seed or random.SystemRandom().randrange(1, 2**31), DURATION)
    assert done.returncode == 0, f"seed {seed}, logs under {tmp_path}:\n{done.stdout[-12000:]}{done.stderr[-4000:]}"
    assert "the checker found nothing" in done.stdout


# Seconds each planted defect runs: enough for its rule to see it at the fixed seed. A leak needs
# the RSS baseline (taken 10 s after each start) and time to grow past the bound; every-one-leads
# says it leads 10 s after its start; a watch never resumed is seen only after a heal the mirror
# does not re-list past by chance, which 10 s, beside another run, did not always hold; a NOSPACE
# taken for success is caught when a push lands in an alarm's window, which the quota takes seconds to fill for.
DEFECT_SECONDS = {"leaks": "25", "every-one-leads": "15", "watch-stops-when-broken": "20", "nospace-as-success": "15"}
# The faults a defect's run draws from, where its rule judges only some: the others' time goes to those.
DEFECT_FAULTS = {
    "ack-before-reply": "partition", "nospace-as-success": "nospace", "deposed-leader-publishes": "leader-stop,backend-flap",
    "watch-stops-when-broken": "reset", "readiness-ignores-silence": "partition",
}
# Defect runs at once: a defect run is judged on the violation it plants, which two sharing the
# machine's cores still plant; it halves the time the fourteen take.
DEFECTS_AT_ONCE = 2


@pytest.fixture(scope="module")
def defect_runs(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[subprocess.CompletedProcess[str]]]]:
    """The selected defects' runs, DEFECTS_AT_ONCE at a time, started once for the module (each test waits for its own)."""
    # Only this module's: the simulation's tests take a `defect` too, which the campaign has not.
    selected = sorted({item.callspec.params["defect"] for item in request.session.items
                       if item.path == request.path and hasattr(item, "callspec") and "defect" in item.callspec.params})
    workdir = tmp_path_factory.mktemp("defects")
    # Each run at once takes its own block of ports below the ephemeral range.
    blocks: queue.Queue[str] = queue.Queue()
    for n in range(DEFECTS_AT_ONCE):
        blocks.put(f"{20000 + n * 6000}-{26000 + n * 6000}")
    with ThreadPoolExecutor(DEFECTS_AT_ONCE) as pool:
        yield {defect: pool.submit(_defect_run, workdir / defect, defect, blocks) for defect in selected}


def _defect_run(workdir: Path, defect: str, blocks: queue.Queue[str]) -> subprocess.CompletedProcess[str]:
    # A defect that keeps a fleet from converging waits out the whole convergence timeout: a short
    # one, since a defect run is judged on the violation it plants, and more of them change nothing.
    faults = ("--faults", DEFECT_FAULTS[defect]) if defect in DEFECT_FAULTS else ()
    ports = blocks.get()
    try:
        return judged(workdir, FIXED_SEED, DEFECT_SECONDS.get(defect, "10"), "--defect", defect, "--converge-timeout", "5", *faults,
                      ports=ports)[1]
    finally:
        blocks.put(ports)


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_every_planted_defect_is_caught_by_its_rule(defect_runs: dict[str, Future[subprocess.CompletedProcess[str]]], defect: str) -> None:
    """Each defect (tests/campaign/defects.py) breaks one rule on purpose; a run must exit 1 with a
    violation of a rule its docstring names (e.g. rule 1 for an acknowledged upsert never written:
    missing at the end, or not durable when answered)."""
    rules = set(re.findall(r"\d+", re.search(r"\(rules? ([^):]*)", DEFECTS[defect].__doc__ or "")[1]))  # type: ignore[index]
    done = defect_runs[defect].result()
    assert done.returncode == 1, done.stdout[-8000:] + done.stderr[-4000:]
    caught = set(re.findall(r"^VIOLATION rule (\d+)", done.stdout, re.MULTILINE)) | _more(done.stdout)
    assert caught & rules, f"{defect} (rules {sorted(rules)}) caught by {sorted(caught)}:\n{done.stdout[-8000:]}{done.stderr[-4000:]}"


def _more(stdout: str) -> set[str]:
    """The rules of the violations past those printed ("... and N more violations (rules [1, 9])")."""
    found = re.search(r"^\.\.\. and \d+ more violations \(rules \[([\d, ]*)\]\)", stdout, re.MULTILINE)
    return set(re.findall(r"\d+", found[1])) if found else set()
