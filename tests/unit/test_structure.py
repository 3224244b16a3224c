"""The package stays easy to change: no class over 200 lines, no function over 50; one owner for the commit rule."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.etcd.types import Compare
from exporter.keys import IngressRef
from exporter.store.records import Removal
from tests.fake_reconciler import LAYOUT, UP, elected_etcd
from tests.fake_reconciler import running as fake_running
from tests.helpers import AUTHORITY, REPO, record, uid

PACKAGE = REPO / "exporter"


def _sizes() -> list[tuple[int, str, str]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                out.append((node.end_lineno - node.lineno + 1, kind, f"{path.relative_to(PACKAGE.parent)}:{node.name}"))
    return out


def test_no_class_over_200_lines_and_no_function_over_50() -> None:
    too_big = [(n, kind, where) for n, kind, where in _sizes() if n > (200 if kind == "class" else 50)]
    assert too_big == []


async def test_only_the_commit_rule_builds_a_record_compare(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every compare on a record key is built in plan/guards.py: traced where each `Compare` is made
    while a reconciler writes a whole ingress, a split one, a paced one and a removal (not by names)."""
    built: set[str] = set()
    new = Compare.__new__

    def traced(cls: type[Compare], key: str, *args: object, **kwargs: object) -> Compare:
        if key.startswith(LAYOUT.records_dir):
            built.add(str(Path(sys._getframe(1).f_code.co_filename).resolve().relative_to(PACKAGE.parent)))
        return new(cls, key, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Compare, "__new__", traced)
    etcd = await elected_etcd()
    etcd.max_txn_ops = 16  # 40 servers: several transactions, each later one guarded by the first
    applied = {"revision": 0}

    def behind(root: str) -> bool:
        latest = rec.observed.beacons.latest(root)
        return latest is not None and latest.revision > applied["revision"]

    async with fake_running(etcd, behind=behind) as rec:
        whole, split, paced = uid(), uid(), uid()
        await rec.submit([record(whole, upstream=UP)])
        applied["revision"] = etcd.revision
        rec.traefik_checked()
        await rec.submit([record(split, upstream={"servers": [{"url": f"http://10.0.0.{n}:80"} for n in range(40)]})])
        await rec.submit([record(paced, upstream=UP)])  # Traefik has not applied the split one: its record commits alone
        assert rec.keys_pending(IngressRef(AUTHORITY, paced))
        await rec.submit([], [Removal(IngressRef(AUTHORITY, whole), 1)])
    assert built == {"exporter/plan/guards.py"}


def _imports() -> dict[str, set[str]]:
    """Each module of the package and the package modules it imports (under TYPE_CHECKING too)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join([*base, node.module] if node.module else base)
                found |= {f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def test_no_import_cycle_in_the_package() -> None:
    graph = _imports()
    done: set[str] = set()

    def cycle_from(name: str, path: list[str]) -> list[str] | None:
        if name in path:
            return [*path[path.index(name):], name]
        if name in done:
            return None
        for target in sorted(graph[name]):
            if found := cycle_from(target, [*path, name]):
                return found
        done.add(name)
        return None

    cycles = [c for name in sorted(graph) if (c := cycle_from(name, []))]
    assert cycles == []


# The data flow of docs/writer.md: a package never imports one after it.
FLOW = ["store", "plan", "write", "reconcile"]


def test_imports_run_one_way_store_plan_write_reconcile_and_sources_hand_over_records() -> None:
    backwards = []
    for name, targets in _imports().items():
        package = name.split(".")[1] if "." in name else ""
        for target in targets:
            other = target.split(".")[1] if "." in target else ""
            if package in FLOW and other in FLOW and FLOW.index(other) > FLOW.index(package):
                backwards.append(f"{name} -> {target}")
            if package == "sources" and other == "reconcile":
                backwards.append(f"{name} -> {target}")
    assert backwards == []


def test_the_daemon_assigns_no_attribute_of_another_object() -> None:
    """The daemon starts, runs and stops the parts assembly built: it wires nothing by assignment."""
    foreign = []
    for node in ast.walk(ast.parse((PACKAGE / "daemon.py").read_text())):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Attribute) and not (isinstance(target.value, ast.Name) and target.value.id == "self"):
                foreign.append(f"line {node.lineno}: {ast.unparse(target)}")
    assert foreign == []


def test_no_module_over_350_lines() -> None:
    long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 350}
    assert long == {}


def test_no_switch_on_an_upstream_kind_outside_the_ingress_model() -> None:
    """What differs between upstream kinds is asked of the model (`members()`, `needs_plugin`), not switched on."""
    from exporter.ingress import upstreams

    models = ("Upstream", "Instance", "Server")
    kinds = {name for name, value in vars(upstreams).items() if isinstance(value, type) and name.endswith(models)}
    switches = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "ingress":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
                named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)} | {
                    n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
                if named & kinds:
                    switches.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert len(kinds) >= 5 and switches == []


def test_the_tests_are_laid_out_like_the_package() -> None:
    """Unit tests under tests/unit/<package>/ (pure, or on the in-memory etcd), those on the real etcd and
    Traefik under tests/integration/ (marked so), the deployment files' under tests/deploy/, the fault
    campaign and its checker under tests/campaign/, the deterministic simulation under tests/simulation/."""
    tests = REPO / "tests"
    assert sorted(d.name for d in (tests / "unit").iterdir() if d.is_dir() and d.name != "__pycache__") == sorted(
        d.name for d in (tests / "unit").iterdir() if d.is_dir() and (REPO / "exporter" / d.name).is_dir()
    )
    assert sorted(p.name for p in tests.glob("test_*.py")) == []
    packages = sorted(d.name for d in tests.iterdir() if (d / "__init__.py").exists())
    assert packages == ["campaign", "deploy", "integration", "simulation", "unit"]
    unmarked = [p.name for p in (tests / "integration").glob("test_*.py") if "pytest.mark.integration" not in p.read_text()]
    marked = [p.name for p in (tests / "unit").rglob("test_*.py") if "\npytestmark = pytest.mark.integration" in p.read_text()]
    assert unmarked == [] and marked == []


def test_every_benchmark_runs_as_a_module_on_the_harness() -> None:
    """`python -m bench.NAME --help` works for each benchmark, each takes its arguments from the harness,
    and none edits sys.path (floor_server, relay and probe_sidecar are processes a benchmark starts, not benchmarks)."""
    helpers = {"__init__", "common", "harness", "floor_server", "relay", "probe_sidecar"}
    names = sorted(p.stem for p in (REPO / "bench").glob("*.py") if p.stem not in helpers)
    assert len(names) == 13
    assert [p.name for p in (REPO / "bench").glob("*.py") if "sys.path" in p.read_text()] == []
    assert [n for n in names if "arguments(__doc__" not in (REPO / "bench" / f"{n}.py").read_text()] == []
    procs = {n: subprocess.Popen([sys.executable, "-m", f"bench.{n}", "--help"], cwd=REPO, stdout=subprocess.PIPE, text=True)
             for n in names}
    helps = {n: proc.communicate(timeout=120) for n, proc in procs.items()}
    assert {n: procs[n].returncode for n in names} == dict.fromkeys(names, 0)
    assert all(f"python -m bench.{n}" in out for n, (out, _err) in helps.items())
