"""Metrics live on a registry each daemon owns; derived gauges are read at scrape."""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest
from loguru import logger
from prometheus_client import generate_latest

import exporter.discovery
from exporter.assembly.parts import assemble
from exporter.config import Settings
from exporter.keys import IngressRef
from exporter.metrics import Metrics
from exporter.write.pacer import Pacer
from tests.helpers import REPO

PACKAGE = REPO / "exporter"


def test_two_daemons_in_one_process_keep_their_own_numbers() -> None:
    one, two = assemble(Settings()), assemble(Settings())
    assert one.metrics.registry is not two.metrics.registry
    one.metrics.etcd_txns.labels("committed").inc(3)
    assert one.metrics.value("exporter_etcd_txns_total", {"result": "committed"}) == 3
    assert two.metrics.value("exporter_etcd_txns_total", {"result": "committed"}) == 0


def test_a_derived_gauge_reads_the_part_at_scrape_time() -> None:
    metrics, behind = Metrics(), {"traefik/a": True}
    pacer = Pacer(behind.__getitem__, hold_max=60.0)
    metrics.paced_ingresses.read_from(pacer.counts)
    assert metrics.registry.get_sample_value("exporter_writer_paced_ingresses", {"root": "traefik/a"}) is None
    pacer.hold(IngressRef("a", "x"), "traefik/a", "test")
    pacer.hold(IngressRef("a", "y"), "traefik/a", "test")
    assert metrics.value("exporter_writer_paced_ingresses", {"root": "traefik/a"}) == 2
    behind["traefik/a"] = False
    pacer.due()
    # A root that held keys reads 0 once they are written, rather than vanishing.
    assert metrics.registry.get_sample_value("exporter_writer_paced_ingresses", {"root": "traefik/a"}) == 0


def test_a_reader_that_raises_is_logged_and_leaves_the_rest_of_the_scrape() -> None:
    metrics = Metrics()
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="ERROR", format="{message}\n{exception}")

    def broken() -> list[tuple[tuple[str, ...], float]]:
        raise RuntimeError("reader broke")

    metrics.leader.read_from(broken)
    metrics.discovery_registered.read_from(lambda: [((), 1.0)])
    try:
        text = generate_latest(metrics.registry).decode()
    finally:
        logger.remove(sink)
    assert "exporter_discovery_registered 1.0" in text and "\nexporter_leader " not in text
    assert any("reading exporter_leader failed" in line and "reader broke" in line for line in lines)


def test_no_metric_is_made_outside_the_metrics_module() -> None:
    """Every metric is on the daemon's registry: none is built on the global one elsewhere."""
    made = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "metrics.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("Counter", "Gauge", "Histogram")
                and node.args and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("exporter_")
            ):
                made.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert made == []


def _takes_metrics(obj: object) -> bool:
    try:
        return callable(obj) and "metrics" in inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return False


@pytest.mark.parametrize("module", ["parts", "factories", "apps"])
def test_the_assembly_hands_its_metrics_to_every_part_that_counts(module: str) -> None:
    """A part that takes `metrics` and is built without it would count on a registry nobody scrapes
    (which parts take it is read from their signatures)."""
    source = importlib.import_module(f"exporter.assembly.{module}")
    names = {**vars(exporter.discovery), **vars(source)}  # factories imports Discovery only when it is configured
    takes = {name for name, obj in names.items() if _takes_metrics(obj)}
    tree = ast.parse((PACKAGE / "assembly" / f"{module}.py").read_text())
    # Defaults of a signature build nothing the daemon runs (the CLI's one-shot reconciler).
    defaults = {id(d) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for d in [*f.args.defaults, *f.args.kw_defaults]}
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
             and node.func.id in takes and id(node) not in defaults]
    assert calls

    def passes(call: ast.Call) -> bool:
        return "metrics" in {k.arg for k in call.keywords} or any(isinstance(a, ast.Name) and a.id == "metrics" for a in call.args)

    missing = [f"{module}.py:{c.lineno} {ast.unparse(c.func)}" for c in calls if not passes(c)]
    assert missing == []


def test_every_metric_is_documented() -> None:
    table = (PACKAGE.parent / "docs" / "operations.md").read_text()
    names = {m.name for m in Metrics().registry.collect()}
    own = {n for n in names if n.startswith("exporter_")}
    assert len(own) == 34
    assert sorted(n for n in own if f"`{n}" not in table) == []
    # The standard families every Prometheus client exports, documented as one row.
    assert {n.split("_")[0] for n in names - own} == {"process", "python"}
    assert "`process_*`" in table and "`python_*`" in table


def test_counters_with_known_label_values_start_at_zero_so_the_first_event_counts() -> None:
    metrics = Metrics()
    for name, labels in [("exporter_etcd_txns_total", {"result": "conflict"}),
                         ("exporter_health_probes_total", {"result": "timeout_failure"}),
                         ("exporter_health_transitions_total", {"to": "unhealthy"})]:
        assert metrics.registry.get_sample_value(name, labels) == 0, (name, labels)


def test_the_registry_carries_the_standard_process_metrics() -> None:
    text = generate_latest(Metrics().registry).decode()
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds", "python_info"):
        assert f"\n{name}" in text, name
