"""The dashboard, the compose monitoring profile and the documented scrape configurations.

What a real Prometheus makes of them is tests/deploy/test_prometheus.py; here the shape of each
file and what promtool (Debian's `prometheus` package) says about the queries and configurations.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from exporter.metrics import Metrics
from tests.deploy.prometheus_package import debian_binary
from tests.helpers import REPO

DASHBOARD = REPO / "deploy" / "grafana" / "traefik-etcd-exporter.json"
COMPOSE = REPO / "compose"
DS = "${datasource}"
# Metrics of the daemon no panel needs: the raw counters behind the panels' histograms, Python's
# GC and version, and the virtual memory and start time of the process.
NOT_ON_THE_DASHBOARD = {"python_gc_objects_collected", "python_gc_objects_uncollectable", "python_gc_collections",
                        "python_info", "process_virtual_memory_bytes", "process_start_time_seconds"}


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def targets() -> list[tuple[str, str]]:
    """(panel title, query) of every panel."""
    return [(p["title"], t["expr"]) for p in dashboard()["panels"] if p["type"] != "row" for t in p["targets"]]


def promtool() -> str:
    return debian_binary("promtool")


def test_the_dashboard_has_its_variables_and_every_panel_reads_the_chosen_data_source() -> None:
    board = dashboard()
    assert board["uid"] == "traefik-etcd-exporter" and board["title"] == "traefik-etcd-exporter"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert list(variables) == ["datasource", "job", "instance", "root"]
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["job"]["current"]["value"] == "traefik-etcd-exporter"
    assert variables["instance"]["multi"] and variables["instance"]["includeAll"]
    assert variables["root"]["multi"] and variables["root"]["includeAll"]
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    for panel in panels:
        assert panel["datasource"]["uid"] == DS and all(t["datasource"]["uid"] == DS for t in panel["targets"]), panel["title"]
        assert panel["description"] and panel["targets"], panel["title"]


def test_every_query_is_scoped_to_the_chosen_job_instances_and_roots() -> None:
    for title, expr in targets():
        for selector in re.findall(r"\b[a-z_]+\{([^}]*)\}", expr):
            assert 'job=~"$job"' in selector, (title, expr)
            # Leaders are counted over the whole job: one leader among all its instances.
            assert 'instance=~"$instance"' in selector or title == "Leaders per job", (title, expr)
        per_root = re.findall(r"(exporter_(?:traefik|writer)_\w+)\{([^}]*)\}", expr)
        assert all('root=~"$root"' in sel for name, sel in per_root if name != "exporter_traefik_requests_total"), (title, expr)


def test_every_metric_of_the_daemon_is_on_the_dashboard_and_every_query_names_a_real_one() -> None:
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""], "info": ["_info"]}
    exported = {f.name + suffix for f in Metrics().registry.collect() for suffix in suffixes[f.type]} | {"up"}
    queried = {name for _, expr in targets() for name in re.findall(r"\b([a-z_]+)\{", expr)}
    assert queried <= exported, queried - exported
    families = {family.name for family in Metrics().registry.collect()} - NOT_ON_THE_DASHBOARD
    shown = {f for f in families if any(n == f or n.startswith(f + "_") for n in queried)}
    assert families - shown == set()


def test_every_query_parses(tmp_path: Path) -> None:
    """promtool checks each query with the variables as Grafana fills them (every one at All)."""
    def expand(expr: str) -> str:
        return expr.replace("$job", "traefik-etcd-exporter").replace("$instance", ".+").replace("$root", ".+") \
            .replace("$__rate_interval", "1m")
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{n}", "expr": expand(expr)} for n, (_, expr) in enumerate(targets())
    ]}]}
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_monitoring_profile_mounts_the_rules_and_the_dashboard_it_names(tmp_path: Path) -> None:
    spec = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    services = spec["services"]
    assert services["prometheus"]["profiles"] == ["monitoring"] and services["grafana"]["profiles"] == ["monitoring"]
    assert all("profiles" not in s for name, s in services.items() if name not in ("prometheus", "grafana"))

    def mounts(service: str) -> dict[str, Path]:
        """Container path -> the repository path mounted there."""
        out = {}
        for volume in services[service]["volumes"]:
            source, target = volume.split(":")[:2]
            if source.startswith("."):
                out[target] = (COMPOSE / source).resolve()
                assert out[target].exists(), volume
        return out

    prometheus, grafana = mounts("prometheus"), mounts("grafana")
    assert prometheus["/etc/prometheus/alerts.yml"] == REPO / "deploy" / "prometheus" / "alerts.yml"
    # promtool on the compose configuration, its container paths mapped back to the repository.
    config = yaml.safe_load(prometheus["/etc/prometheus/prometheus.yml"].read_text())
    config["rule_files"] = [str(prometheus[f]) for f in config["rule_files"]]
    assert config["scrape_configs"][0]["job_name"] == "traefik-etcd-exporter"
    assert config["scrape_configs"][0]["static_configs"][0]["targets"] == ["exporter:8571"]
    _check_config(tmp_path, config)

    provisioning = grafana["/etc/grafana/provisioning"]
    provider = yaml.safe_load((provisioning / "dashboards" / "traefik-etcd-exporter.yml").read_text())["providers"][0]
    assert (grafana[provider["options"]["path"]] / DASHBOARD.name).is_file()
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"][0]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    assert "127.0.0.1:9090:9090" in services["prometheus"]["ports"] and "127.0.0.1:3000:3000" in services["grafana"]["ports"]


def test_the_exporter_service_runs_read_only_without_capabilities() -> None:
    exporter = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())["services"]["exporter"]
    assert exporter["read_only"] is True and exporter["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in exporter["security_opt"]
    assert "ENV PYTHONDONTWRITEBYTECODE=1" in (REPO / "Dockerfile").read_text()


def test_the_documented_scrape_configurations_are_valid(tmp_path: Path) -> None:
    text = (REPO / "docs" / "operations.md").read_text()
    section = text[text.index("## Scrape configuration"):text.index("## Dashboard")]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    for n, block in enumerate(blocks):
        config = yaml.safe_load(block)
        assert config["scrape_configs"][0]["job_name"] == "traefik-etcd-exporter"
        _check_config(tmp_path / str(n), config)


def _check_config(where: Path, config: dict[str, Any]) -> None:
    where.mkdir(parents=True, exist_ok=True)
    path = where / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([promtool(), "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
