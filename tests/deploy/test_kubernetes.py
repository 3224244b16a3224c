"""The Kubernetes manifests (deploy/kubernetes/, docs/kubernetes.md), proven without a cluster.

`kubectl kustomize` renders the base, etcd alone and each overlay; every object validates
strictly against Kubernetes' schemas (kubernetes-validate) at 1.29 and the newest version it
knows, and the kinds it does not know (the Prometheus Operator's) are checked field by field
here. Then what no schema sees: the security fields of every container, probes on declared
ports, selectors that select, short port names, no secret in a ConfigMap, Traefik reading a root
the exporter writes from the etcd Service, etcd's initial cluster naming the StatefulSet's pods,
the Helm values carrying the same exporter container. Last, the rendered pod runs: its
containers' commands, args, environment and mounted files, with only addresses, ports and paths
made local, start etcd (one member), Traefik and the exporter, which serve a pushed ingress and
step down on SIGTERM as the kubelet sends it.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel, SecretStr

from exporter.config import load_settings
from exporter.embedded import etcd_binary, free_port, traefik_binary
from exporter.keys import KeyLayout
from tests.helpers import REPO, Backend, eventually, serves, uid

KUBE = REPO / "deploy" / "kubernetes"
TARGETS = {
    "base": KUBE,
    "etcd": KUBE / "etcd",
    "servicemonitor": KUBE / "overlays" / "servicemonitor",
    "prometheusrule": KUBE / "overlays" / "prometheusrule",
}
VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]
# Kinds kubernetes-validate has no schema for: each is checked field by field below.
CHECKED_HERE = {"ServiceMonitor", "PrometheusRule"}
WORKLOADS = {"Deployment", "StatefulSet"}
SECURE = {"runAsNonRoot": True, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False}


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl is not on PATH: the manifests cannot be rendered (it is in this machine's base image)")
    return found


@functools.cache
def _render(path: Path) -> str:
    done = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def rendered(target: str) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize` renders for a target (a fresh copy each call)."""
    return [o for o in yaml.safe_load_all(_render(TARGETS[target])) if o]


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in of_kind(objects, kind) if o["metadata"]["name"] == name]
    return found


def templates(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o["spec"]["template"] for o in objects if o["kind"] in WORKLOADS]


def containers(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for template in templates(objects):
        for container in template["spec"]["containers"]:
            yield template, container


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def arg(args: list[str], flag: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")]
    return value


@dataclass(frozen=True)
class Parts:
    """The rendered base and what the tests read of it."""

    base: list[dict[str, Any]]
    pod: dict[str, Any]
    traefik: dict[str, Any]
    exporter: dict[str, Any]
    etcd_set: dict[str, Any]
    etcd: dict[str, Any]
    config: dict[str, Any]  # the exporter's configuration, from its ConfigMap


@functools.cache
def parts() -> Parts:
    """Rendered once, when a test first asks (a missing kubectl fails that test, not the collection)."""
    base = rendered("base")
    pod = named(base, "Deployment", "traefik")["spec"]["template"]
    by_name = {c["name"]: c for c in pod["spec"]["containers"]}
    etcd_set = named(base, "StatefulSet", "etcd")
    (source,) = [v["configMap"]["name"] for v in pod["spec"]["volumes"] if v["name"] == "exporter-config"]
    config = yaml.safe_load(named(base, "ConfigMap", source)["data"]["exporter.yaml"])
    etcd = etcd_set["spec"]["template"]["spec"]["containers"][0]
    return Parts(base, pod, by_name["traefik"], by_name["exporter"], etcd_set, etcd, config)


# ----- rendering and schemas


@pytest.mark.parametrize("target", list(TARGETS))
def test_every_target_renders_namespace_agnostic(target: str) -> None:
    objects = rendered(target)
    assert objects
    for obj in objects:
        assert obj["metadata"]["name"] and "namespace" not in obj["metadata"], obj["metadata"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "traefik-etcd-exporter"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("target", list(TARGETS))
def test_every_object_validates_strictly(target: str, version: str) -> None:
    for obj in rendered(target):
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            assert obj["kind"] in CHECKED_HERE, f"no schema for {obj['kind']} and no test of its fields"


def test_strict_validation_refuses_a_misspelled_field() -> None:
    deployment = copy.deepcopy(named(parts().base, "Deployment", "traefik"))
    deployment["spec"]["template"]["spec"]["containers"][1]["securityContext"]["runAsNonRot"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[0], strict=True)


# ----- what no schema sees


@pytest.mark.parametrize("target", ["base", "etcd"])
def test_every_container_is_locked_down_sized_and_probed(target: str) -> None:
    objects = rendered(target)
    assert list(containers(objects))
    for template, container in containers(objects):
        spec, where = template["spec"], container["name"]
        assert spec["automountServiceAccountToken"] is False, where
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        context = container["securityContext"]
        assert {k: context.get(k) for k in SECURE} == SECURE, where
        assert isinstance(context["runAsUser"], int) and context["runAsUser"] > 0, where
        assert context["capabilities"] == {"drop": ["ALL"]}, where
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, where
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"], where
        assert "readinessProbe" in container and "livenessProbe" in container, where
        # The service account of the pod mounts no token either.
        account = named(objects, "ServiceAccount", spec["serviceAccountName"])
        assert account["automountServiceAccountToken"] is False


def readable(mode: int, user: int, groups: set[int], fs_group: int | None) -> bool:
    """Whether a file Kubernetes mounts from a Secret or ConfigMap (owner root, group the pod's fsGroup) can be read."""
    return bool(mode & 0o004 or (user == 0 and mode & 0o400) or (fs_group in groups and mode & 0o040))


def mounted_readable(pod_spec: dict[str, Any], pod_context: dict[str, Any]) -> list[str]:
    """The volumes from Secrets and ConfigMaps a container mounts but cannot read."""
    volumes = {v["name"]: v.get("secret") or v.get("configMap") for v in pod_spec["volumes"]}
    unreadable = []
    for container in pod_spec["containers"]:
        context = container["securityContext"]
        fs_group = pod_context.get("fsGroup")
        groups = {context["runAsGroup"], *pod_context.get("supplementalGroups", []), *([fs_group] if fs_group else [])}
        for mount in container.get("volumeMounts", []):
            source = volumes[mount["name"]]
            if source is not None and not readable(source.get("defaultMode", 0o644), context["runAsUser"], groups, fs_group):
                unreadable.append(f"{container['name']}: {mount['name']}")
    return unreadable


def test_every_container_can_read_the_files_mounted_for_it() -> None:
    assert mounted_readable(parts().pod["spec"], parts().pod["spec"]["securityContext"]) == []
    values = yaml.safe_load((KUBE / "traefik-helm-values.yaml").read_text())
    chart_pod = {"containers": values["deployment"]["additionalContainers"], "volumes": values["deployment"]["additionalVolumes"]}
    assert mounted_readable(chart_pod, values["podSecurityContext"]) == []
    # The check sees a Secret only root could read.
    assert mounted_readable(parts().pod["spec"], {}) == ["exporter: exporter-api-token"]


@pytest.mark.parametrize("target", ["base", "etcd"])
def test_every_probe_names_a_declared_container_port(target: str) -> None:
    for _template, container in containers(rendered(target)):
        declared = {p["name"] for p in container["ports"]}
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            if kind in container:
                assert container[kind]["httpGet"]["port"] in declared, (container["name"], kind)


def test_port_names_are_iana_service_names() -> None:
    objects = rendered("servicemonitor")
    names = [p["name"] for _t, c in containers(objects) for p in c["ports"]]
    names += [p["name"] for s in of_kind(objects, "Service") for p in s["spec"]["ports"]]
    assert names
    for name in names:
        assert len(name) <= 15 and re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", name) and re.search("[a-z]", name), name


def test_every_selector_selects_a_pod_template_and_a_declared_port() -> None:
    objects = rendered("servicemonitor")
    pods = [t["metadata"]["labels"] for t in templates(objects)]
    ports_of = [{p["name"] for c in t["spec"]["containers"] for p in c["ports"]} for t in templates(objects)]
    for service in of_kind(objects, "Service"):
        chosen = [n for n, labels in enumerate(pods) if selects(service["spec"]["selector"], labels)]
        assert chosen, service["metadata"]["name"]
        for port in service["spec"]["ports"]:
            assert all(port["targetPort"] in ports_of[n] for n in chosen), (service["metadata"]["name"], port)
    for kind in ("PodDisruptionBudget", "NetworkPolicy"):
        for obj in of_kind(objects, kind):
            selector = obj["spec"].get("selector") or obj["spec"]["podSelector"]
            chosen = [n for n, labels in enumerate(pods) if selects(selector["matchLabels"], labels)]
            assert chosen, obj["metadata"]["name"]
            for rule in obj["spec"].get("ingress", []):
                assert all(p["port"] in ports_of[n] for p in rule["ports"] for n in chosen), (obj["metadata"]["name"], rule)
                for peer in rule.get("from", []):
                    # Peers in the same namespace are pods of this base; the coordinator's label is the operator's.
                    if "namespaceSelector" not in peer:
                        assert any(selects(peer["podSelector"]["matchLabels"], labels) for labels in pods), peer
    # A headless peer Service resolves members before they are ready (they form a quorum first).
    peers = named(objects, "Service", parts().etcd_set["spec"]["serviceName"])
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"] is True


def test_network_policies_admit_the_coordinator_to_the_push_port_and_only_the_pods_to_etcd() -> None:
    traefik, etcd = named(parts().base, "NetworkPolicy", "traefik"), named(parts().base, "NetworkPolicy", "etcd")
    push = [r for r in traefik["spec"]["ingress"] if any(p["port"] == "push" for p in r["ports"])]
    assert len(push) == 1 and push[0]["from"] == [
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"traefik-etcd-exporter.io/coordinator": "true"}}}
    ]
    client = [r for r in etcd["spec"]["ingress"] if any(p["port"] == "client" for p in r["ports"])]
    assert len(client) == 1 and all("namespaceSelector" not in peer for peer in client[0]["from"])
    clients = client[0]["from"][0]["podSelector"]["matchLabels"]
    assert selects(clients, parts().pod["metadata"]["labels"])
    assert not selects(clients, parts().etcd_set["spec"]["template"]["metadata"]["labels"])
    peer = [r for r in etcd["spec"]["ingress"] if any(p["port"] == "peer" for p in r["ports"])]
    assert peer[0]["from"][0]["podSelector"]["matchLabels"] == parts().etcd_set["spec"]["selector"]["matchLabels"]


def _secrets(model: BaseModel, where: str = "") -> list[str]:
    """The secret settings given a value (not a file) in a loaded configuration."""
    found = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, SecretStr):
            found.append(f"{where}{name}")
        elif isinstance(value, BaseModel):
            found += _secrets(value, f"{where}{name}.")
    return found


def test_no_secret_value_in_a_config_map(tmp_path: Path) -> None:
    for config_map in of_kind(parts().base, "ConfigMap"):
        for key, text in config_map["data"].items():
            assert not re.search(r"(?i)(token|password|secret)\s*:\s*\S", text.replace("_file:", "-file:")), key
            (tmp_path / key).write_text(text)
            settings = load_settings(tmp_path / key)
            assert _secrets(settings) == [], key
    # Secrets arrive as files, from Secrets, at the paths the configuration names.
    mounts = {m["name"]: m["mountPath"] for m in parts().exporter["volumeMounts"]}
    secret_volumes = {v["name"] for v in parts().pod["spec"]["volumes"] if "secret" in v}
    assert secret_volumes and all(parts().config["api"]["token_file"].startswith(mounts[v] + "/") for v in secret_volumes)
    assert not any(e.get("value") for c in parts().pod["spec"]["containers"] for e in c.get("env", []))


def test_traefik_reads_a_root_the_exporter_writes_through_the_etcd_service() -> None:
    args = parts().traefik["args"]
    root = arg(args, "--providers.etcd.rootKey")
    layout = KeyLayout(parts().config["root_key"], parts().config["records_prefix"])
    authority = root.removeprefix(layout.root(""))
    assert authority and layout.root(authority) == root
    service = named(parts().base, "Service", "etcd")
    (client,) = service["spec"]["ports"]
    assert arg(args, "--providers.etcd.endpoints") == f"{service['metadata']['name']}:{client['port']}"
    assert parts().config["etcd"]["endpoints"] == [f"http://{service['metadata']['name']}:{client['port']}"]
    assert selects(service["spec"]["selector"], parts().etcd_set["spec"]["template"]["metadata"]["labels"])
    # The exporter reads Traefik's API in the same pod, on loopback.
    api = arg(args, "--entryPoints.traefik.address")
    assert api.startswith("127.0.0.1:") and parts().config["traefik"]["api_url"] == f"http://{api}"
    assert "--api.insecure=true" in args


def test_etcd_members_name_the_statefulset_pods() -> None:
    spec, args = parts().etcd_set["spec"], parts().etcd["args"]
    service = spec["serviceName"]
    peer = next(p["containerPort"] for p in parts().etcd["ports"] if p["name"] == "peer")
    pods = [f"{parts().etcd_set['metadata']['name']}-{n}" for n in range(spec["replicas"])]
    assert spec["podManagementPolicy"] == "Parallel"
    members = dict(m.split("=", 1) for m in arg(args, "--initial-cluster").split(","))
    assert members == {pod: f"http://{pod}.{service}.$(POD_NAMESPACE).svc:{peer}" for pod in pods}
    assert arg(args, "--name") == "$(POD_NAME)"
    assert arg(args, "--initial-advertise-peer-urls") == f"http://$(POD_NAME).{service}.$(POD_NAMESPACE).svc:{peer}"
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in parts().etcd["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    assert arg(args, "--auto-compaction-mode") == "periodic" and int(arg(args, "--quota-backend-bytes")) > 0
    image = parts().etcd["image"]
    assert re.fullmatch(r"quay\.io/coreos/etcd:v3\.5\.\d+", image) and int(image.rsplit(".", 1)[1]) > 2, image
    assert named(parts().base, "PodDisruptionBudget", "etcd")["spec"]["minAvailable"] == 2


def test_rolling_updates_one_pod_at_a_time_spread_over_nodes() -> None:
    deployment = named(parts().base, "Deployment", "traefik")["spec"]
    assert deployment["replicas"] == 2
    assert deployment["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    assert named(parts().base, "PodDisruptionBudget", "traefik")["spec"]["maxUnavailable"] == 1
    for template in templates(parts().base):
        (spread,) = template["spec"]["topologySpreadConstraints"]
        assert spread["topologyKey"] == "kubernetes.io/hostname"
        assert spread["labelSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()


def test_the_helm_values_carry_the_same_exporter_container() -> None:
    values = yaml.safe_load((KUBE / "traefik-helm-values.yaml").read_text())
    (container,) = values["deployment"]["additionalContainers"]
    assert container == parts().exporter
    volumes = [v for v in parts().pod["spec"]["volumes"] if v["name"] in {m["name"] for m in parts().exporter["volumeMounts"]}]
    unhashed = [v | {"configMap": {"name": "traefik-etcd-exporter-config"}} if "configMap" in v else v for v in volumes]
    assert values["deployment"]["additionalVolumes"] == unhashed
    # The provider's arguments, the API the exporter reads, and the label etcd's NetworkPolicy admits.
    assert set(values["additionalArguments"]) <= set(parts().traefik["args"])
    assert {a.split("=", 1)[0] for a in values["additionalArguments"]} >= {
        "--providers.etcd.endpoints", "--providers.etcd.rootKey", "--providers.providersThrottleDuration", "--api.insecure"}
    assert values["deployment"]["podLabels"].items() <= parts().pod["metadata"]["labels"].items()
    assert values["resources"] == parts().traefik["resources"]


def _rules() -> dict[str, Any]:
    alerts = yaml.safe_load((REPO / "deploy" / "prometheus" / "alerts.yml").read_text())
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "traefik-etcd-exporter"},
        "spec": {"groups": alerts["groups"]},
    }


def test_the_prometheus_rule_is_deploy_prometheus_alerts_yml() -> None:
    golden = KUBE / "overlays" / "prometheusrule" / "prometheusrule.yaml"
    header = "# Generated from deploy/prometheus/alerts.yml by tests/deploy/test_kubernetes.py (GOLDEN_WRITE=1); do not edit.\n"
    if os.environ.get("GOLDEN_WRITE") == "1":
        golden.write_text(header + yaml.safe_dump(_rules(), sort_keys=False, width=200))
    assert yaml.safe_load(golden.read_text()) == _rules()
    (rule,) = of_kind(rendered("prometheusrule"), "PrometheusRule")
    assert rule["spec"] == _rules()["spec"]
    assert all({"severity"} <= r["labels"].keys() and "for" in r for g in rule["spec"]["groups"] for r in g["rules"])


def test_the_service_monitor_scrapes_every_sidecar_as_the_job_the_alerts_expect() -> None:
    objects = rendered("servicemonitor")
    (monitor,) = of_kind(objects, "ServiceMonitor")
    spec = monitor["spec"]
    services = [s for s in of_kind(objects, "Service") if selects(spec["selector"]["matchLabels"], s["metadata"]["labels"])]
    assert [s["metadata"]["name"] for s in services] == ["traefik-etcd-exporter-control"]
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] in {p["name"] for p in services[0]["spec"]["ports"]} and endpoint["path"] == "/metrics"
    assert services[0]["metadata"]["labels"][spec["jobLabel"]] == "traefik-etcd-exporter"
    assert 'job="traefik-etcd-exporter"' in (REPO / "deploy" / "prometheus" / "alerts.yml").read_text()
    assert set(spec) <= {"jobLabel", "selector", "endpoints"} and set(endpoint) <= {"port", "path", "interval"}


# ----- the rendered pod runs


# host:port in an argument, a URL or the configuration (`:8000`, `0.0.0.0:2379`, `etcd:2379`, `$(POD_NAME).etcd-peer...:2380`)
ADDRESS = re.compile(r"(?P<host>[A-Za-z0-9.$()_-]*):(?P<port>\d{2,5})\b")


@dataclass
class LocalPod:
    """The rendered containers as local processes: ports and paths mapped, nothing else changed."""

    work: Path
    ports: dict[int, int] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def port(self, number: int) -> int:
        return self.ports.setdefault(number, free_port())

    def localize(self, text: str, paths: dict[str, Path], own: dict[int, int] | None = None) -> str:
        """`text` with every address on a local port (`own`: this container's ports where it differs) and mounts on local paths."""
        mine = own or {}
        text = ADDRESS.sub(lambda m: f"127.0.0.1:{mine.get(int(m['port'])) or self.port(int(m['port']))}", text)
        for mounted, local in sorted(paths.items(), key=lambda item: -len(item[0])):
            text = text.replace(mounted, str(local))
        return text

    def url(self, container: dict[str, Any], name: str) -> str:
        number = next(p["containerPort"] for p in container["ports"] if p["name"] == name)
        return f"http://127.0.0.1:{self.port(number)}"

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = (self.work / f"{name}.log").open("ab")
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("EXPORTER_", "TRAEFIK_"))}
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**clean, **env}, start_new_session=True)
        self.procs[name] = proc
        return proc

    def stop(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                continue
            if name == "traefik":
                proc.kill()  # sent SIGTERM, it keeps accepting requests 5 s more (its args); nothing is in flight here
            else:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def expand(container: dict[str, Any], pod_name: str, text: str) -> str:
    """Kubernetes' `$(VAR)` expansion of the container's environment (the downward API's fields given)."""
    fields = {"metadata.name": pod_name, "metadata.namespace": "local"}
    for env in container.get("env", []):
        value = env["value"] if "value" in env else fields[env["valueFrom"]["fieldRef"]["fieldPath"]]
        text = text.replace(f"$({env['name']})", value)
    return text


def mounted_files(pod: LocalPod, container: dict[str, Any], secrets: dict[str, dict[str, str]], name: str) -> dict[str, Path]:
    """Each volume mount of the container as a local directory holding what Kubernetes would put there."""
    paths = {}
    volumes = {v["name"]: v for v in parts().pod["spec"]["volumes"]}
    for mount in container.get("volumeMounts", []):
        local = pod.work / name / mount["name"]
        local.mkdir(parents=True, exist_ok=True)
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            for key, text in named(parts().base, "ConfigMap", volume["configMap"]["name"])["data"].items():
                (local / key).write_text(text)
        elif "secret" in volume:
            for key, value in secrets[volume["secret"]["secretName"]].items():
                (local / key).write_text(value)
        paths[mount["mountPath"]] = local
    return paths


def start_exporter(pod: LocalPod, name: str, secrets: dict[str, dict[str, str]], own: dict[int, int]) -> subprocess.Popen[bytes]:
    """One sidecar of the Deployment: its command and mounted files localized; `own`: its listening ports (another replica)."""
    paths = mounted_files(pod, parts().exporter, secrets, name)
    for local in paths.values():
        for file in local.iterdir():
            file.write_text(pod.localize(file.read_text(), paths, own))
    argv = [pod.localize(expand(parts().exporter, name, a), paths, own) for a in parts().exporter["command"]]
    argv[0] = str(Path(sys.executable).parent / argv[0])
    return pod.start(name, argv, {})


@pytest.fixture(scope="module")
def local_pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalPod, dict[str, dict[str, str]]]]:
    pod = LocalPod(tmp_path_factory.mktemp("pod"))
    secrets = {"traefik-etcd-exporter-api": {"token": f"k8s-{uid()}"}}
    try:
        # etcd, one member of the StatefulSet: its own entry of the initial cluster.
        data = {"/var/lib/etcd": pod.work / "etcd-data"}
        args = [pod.localize(expand(parts().etcd, "etcd-0", a), data) for a in parts().etcd["args"]]
        args = [a if not a.startswith("--initial-cluster=") else "--initial-cluster=" + a.split("=", 1)[1].split(",")[0] for a in args]
        pod.start("etcd", [etcd_binary(), *args], {})
        pod.start("traefik", [traefik_binary(), *(pod.localize(a, {}) for a in parts().traefik["args"])], {})
        start_exporter(pod, "traefik-0", secrets, {})
        yield pod, secrets
    finally:
        pod.stop()


async def answers(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(url) as resp:
            return resp.status == 200
    except aiohttp.ClientError:
        return False


@pytest.mark.integration
async def test_the_rendered_pod_serves_a_pushed_ingress(
    local_pod: tuple[LocalPod, dict[str, dict[str, str]]], http: aiohttp.ClientSession, backends: list[Backend]
) -> None:
    pod, secrets = local_pod
    control = pod.url(parts().exporter, "control")
    await eventually(lambda: answers(http, f"{control}/readyz"), timeout=60)
    # Every probe of every container answers on the port it names.
    for container in (parts().etcd, parts().traefik, parts().exporter):
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            if kind in container:
                probe = container[kind]["httpGet"]
                assert await answers(http, pod.url(container, probe["port"]) + probe["path"]), (container["name"], kind)
    backends.append(await Backend("k8s-pod").start())
    iid = uid()
    root = arg(parts().traefik["args"], "--providers.etcd.rootKey")
    body = {"ingresses": [{"authority": root.removeprefix("traefik/worker_"), "id": iid, "revision": 1, "hosts": [f"{iid}.test"],
                           "upstream": {"servers": [{"url": backends[-1].url}]}}]}
    headers = {"Authorization": f"Bearer {secrets['traefik-etcd-exporter-api']['token']}"}
    async with http.post(pod.url(parts().exporter, "push") + "/v2/ingress/upsert", json=body, headers=headers) as resp:
        assert resp.status == 204, await resp.text()
    await eventually(lambda: serves(http, pod.url(parts().traefik, "web"), f"{iid}.test", body="k8s-pod"), timeout=30)


async def leads(session: aiohttp.ClientSession, control: str) -> bool:
    try:
        async with session.get(f"{control}/metrics") as resp:
            return bool(re.search(r"^exporter_leader 1(\.0)?$", await resp.text(), re.MULTILINE))
    except aiohttp.ClientError:
        return False


@pytest.mark.integration
async def test_a_sidecar_sent_sigterm_as_the_kubelet_does_steps_down_within_the_grace_period(
    local_pod: tuple[LocalPod, dict[str, dict[str, str]]], http: aiohttp.ClientSession
) -> None:
    pod, secrets = local_pod
    # The second replica's sidecar, on ports of its own.
    own = {p["containerPort"]: free_port() for p in parts().exporter["ports"]}
    second = start_exporter(pod, "traefik-1", secrets, own)
    controls = {"traefik-0": pod.url(parts().exporter, "control"), "traefik-1": f"http://127.0.0.1:{own[8571]}"}
    await eventually(lambda: answers(http, f"{controls['traefik-1']}/readyz"), timeout=60)
    leader = await eventually(lambda: _leader(http, controls), timeout=30)
    follower = next(name for name in controls if name != leader)
    proc = pod.procs[leader] if leader != "traefik-1" else second
    grace = parts().pod["spec"]["terminationGracePeriodSeconds"]
    ttl = parts().config.get("leader", {}).get("ttl", 10)
    # The kubelet: SIGTERM to the container's main process, SIGKILL after the grace period.
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    await eventually(lambda: leads(http, controls[follower]), timeout=grace)
    handed_over = time.monotonic() - sent
    code = await eventually(lambda: holds_exit(proc), timeout=grace)
    exited = time.monotonic() - sent
    assert code == [0], (code, (pod.work / f"{leader}.log").read_text()[-4000:])
    assert exited < grace
    # Handed over by the stopping sidecar (its lease revoked), not by the lease running out.
    assert handed_over < ttl, f"the follower led {handed_over:.1f}s after SIGTERM (lease ttl {ttl}s)"
    log = (pod.work / f"{leader}.log").read_text()
    assert "shutting down" in log and "Traceback" not in log
    print(f"SIGTERM: the follower led after {handed_over:.2f} s, the sidecar exited after {exited:.2f} s (grace {grace} s)")


async def _leader(session: aiohttp.ClientSession, controls: dict[str, str]) -> str | None:
    for name, control in controls.items():
        if await leads(session, control):
            return name
    return None


async def holds_exit(proc: subprocess.Popen[bytes]) -> list[int] | None:
    """The exit code once the process ended, in a list (`eventually` waits for a truthy value; 0 is not)."""
    code = proc.poll()
    return None if code is None else [code]
