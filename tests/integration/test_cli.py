"""The command line against a real etcd: `render`, `diff` (output and exit codes), `run --dry-run`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
import yaml

from exporter.assembly import build_reconciler
from exporter.config import load_settings
from exporter.embedded import EmbeddedEtcd
from exporter.etcd.client import EtcdClient
from exporter.keys import KeyLayout
from tests.helpers import (
    REPO,
    eventually,
    ingress_yaml,
    is_ready,
    run_cli,
    start_daemon,
    stop_daemon,
    uid,
)

pytestmark = pytest.mark.integration



def write_config(tmp_path: Path, etcd_url: str) -> tuple[Path, str]:
    space = uid("cli")
    cfg = tmp_path / "exporter.yaml"
    cfg.write_text(
        f'etcd: {{endpoints: ["{etcd_url}"]}}\n'
        f'root_key: "{space}/worker_{{authority}}"\n'
        f'records_prefix: "{space}/records"\n'
        'sources: {files: ["ingresses/*.yaml"]}\n'
    )
    (tmp_path / "ingresses").mkdir()
    return cfg, space


def test_render_prints_keys_without_etcd(tmp_path: Path) -> None:
    cfg = tmp_path / "exporter.yaml"
    cfg.write_text('etcd: {endpoints: ["http://127.0.0.1:9"]}\nsources: {files: ["ingresses/*.yaml"]}\n')
    (tmp_path / "ingresses").mkdir()
    (tmp_path / "ingresses" / "one.yaml").write_text(ingress_yaml("web1", 1, 8000, authority="cli"))
    out = run_cli("render", "--config", str(cfg))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "traefik/worker_cli/http/routers/cli_web1/rule = Host(`web1.test`)" in lines
    assert "traefik/worker_cli/_meta/owner = traefik-etcd-exporter" in lines
    assert "traefik/worker_cli/tls/stores/default/defaultCertificate/certFile = <generated certificate>" in lines
    assert "# authority 'cli': root traefik/worker_cli, object names cli_<id>[_<suffix>]" in lines


def test_render_warns_of_a_pattern_that_matches_no_file_and_exits_0(tmp_path: Path) -> None:
    cfg = tmp_path / "exporter.yaml"
    cfg.write_text('etcd: {endpoints: ["http://127.0.0.1:9"]}\nsources: {files: ["ingresses/*.yaml"]}\n')
    out = run_cli("render", "--config", str(cfg))
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""
    assert out.stderr.splitlines() == [
        f"WARNING: sources.files pattern '{tmp_path}/ingresses/*.yaml' matches no file "
        f"(resolved against {tmp_path}/ingresses, which does not exist)"
    ]
    (tmp_path / "ingresses").mkdir()
    assert f"matches no file (resolved against {tmp_path}/ingresses)" in run_cli("render", "--config", str(cfg)).stderr


def test_render_of_the_examples_shows_each_example_ingresss_router() -> None:
    examples = REPO / "examples"
    out = run_cli("render", "--config", str(examples / "exporter.yaml"))
    assert out.returncode == 0 and out.stderr == "", out.stderr
    declared = yaml.safe_load((examples / "ingresses" / "example.yaml").read_text())["ingresses"]
    assert len(declared) >= 2
    for ingress in declared:
        rule = f"traefik/worker_{ingress['authority']}/http/routers/{ingress['authority']}_{ingress['id']}/rule"
        assert any(line.startswith(f"{rule} = Host(`{ingress['hosts'][0]}`)") for line in out.stdout.splitlines()), out.stdout
    # docs/cli.md shows this very output.
    documented = (REPO / "docs" / "cli.md").read_text()
    assert [line for line in out.stdout.splitlines() if f"  {line}\n" not in documented] == []


def test_render_shows_the_label_a_free_text_authority_maps_to(tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text(ingress_yaml("web1", 1, 8000, authority="Worker_1"))
    out = run_cli("render", str(tmp_path / "one.yaml"))
    assert out.returncode == 0, out.stderr
    label = KeyLayout().object_label("Worker_1")
    assert f"# authority 'Worker_1': root traefik/worker_Worker_1, object names {label}_<id>[_<suffix>]" in out.stdout
    assert f"traefik/worker_Worker_1/http/routers/{label}_web1/rule = Host(`web1.test`)" in out.stdout


def test_render_reports_every_bad_field_and_exits_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("ingresses:\n  - {authority: 'a/b', id: '1', revision: -1, upstream: {servers: []}}\n")
    out = run_cli("render", str(bad))
    assert out.returncode == 1
    for field in ("ingresses.0.authority", "ingresses.0.id", "ingresses.0.revision", "ingresses.0.upstream.servers.servers"):
        assert field in out.stderr
    assert "Traceback" not in out.stderr


async def test_diff_shows_pending_change_and_exit_codes(tmp_path: Path, etcd: EmbeddedEtcd) -> None:
    cfg, space = write_config(tmp_path, etcd.url)
    iid = uid()
    ingress_file = tmp_path / "ingresses" / "a.yaml"
    ingress_file.write_text(ingress_yaml(iid, 1, 8000, authority="cli"))

    first = await asyncio.to_thread(run_cli, "diff", "--config", str(cfg))
    assert first.returncode == 2, first.stderr
    assert f"+ {space}/worker_cli/http/routers/cli_{iid}/rule = Host(`{iid}.test`)" in first.stdout
    assert f"+ {space}/records/cli/{iid} = " in first.stdout
    assert "\x1b[" not in first.stdout  # no colour when not a TTY

    # Apply it with the daemon's own reconciler, then nothing is pending.
    settings = load_settings(cfg)
    async with EtcdClient(settings.etcd.endpoints) as client:
        rec = build_reconciler(settings, client)
        await rec.start()
        await rec.wait_synced(20)
        from exporter.sources.files import IngressFiles

        await IngressFiles(settings.sources.files, rec).sync_all()
        await rec.stop()
    clean = await asyncio.to_thread(run_cli, "diff", "--config", str(cfg))
    assert (clean.returncode, clean.stdout) == (0, ""), clean.stderr

    ingress_file.write_text(ingress_yaml(iid, 2, 8001, authority="cli"))
    changed = await asyncio.to_thread(run_cli, "diff", "--config", str(cfg))
    assert changed.returncode == 2
    assert (
        f"~ {space}/worker_cli/http/services/cli_{iid}/loadBalancer/servers/000/url: "
        "http://127.0.0.1:8000 -> http://127.0.0.1:8001"
    ) in changed.stdout

    ingress_file.unlink()
    removed = await asyncio.to_thread(run_cli, "diff", "--config", str(cfg))
    assert removed.returncode == 2
    assert f"- {space}/worker_cli/http/routers/cli_{iid}/rule (was Host(`{iid}.test`))" in removed.stdout
    async with EtcdClient([etcd.url]) as client:
        await client.delete_prefix(space + "/")


def test_diff_exits_1_when_etcd_is_unreachable(tmp_path: Path) -> None:
    cfg, _ = write_config(tmp_path, "http://127.0.0.1:9")
    out = run_cli("diff", "--config", str(cfg))
    assert out.returncode == 1
    assert "unreachable" in out.stderr and "Traceback" not in out.stderr


async def test_run_dry_run_logs_the_diff_and_writes_nothing(tmp_path: Path, etcd: EmbeddedEtcd) -> None:
    cfg, space = write_config(tmp_path, etcd.url)
    iid = uid()
    (tmp_path / "ingresses" / "a.yaml").write_text(ingress_yaml(iid, 1, 8000, authority="cli"))
    from exporter.embedded import free_port

    env_listen = f"127.0.0.1:{free_port()}"
    proc = start_daemon(
        cfg, None, "--dry-run", capture=True,
        env={"EXPORTER_CONTROL__LISTEN": env_listen, "EXPORTER_LOG__FORMAT": "human", "EXPORTER_API__ENABLED": "false"},
    )
    try:
        async with aiohttp.ClientSession() as session:
            await eventually(lambda: is_ready(session, f"http://{env_listen}"), timeout=20)
        async with EtcdClient([etcd.url]) as client:
            assert (await client.range_prefix(space + "/")).kvs == []
    finally:
        out = stop_daemon(proc)
    assert proc.returncode == 0, out
    assert "dry-run: would apply" in out
    assert f"+ {space}/worker_cli/http/routers/cli_{iid}/rule" in out
    # The generated certificate's private key is a secret: never logged.
    assert "PRIVATE KEY-----\\n" not in out and "<redacted private key>" in out


def test_run_with_an_unreadable_token_file_names_the_field_and_exits_1(tmp_path: Path) -> None:
    cfg = tmp_path / "exporter.yaml"
    cfg.write_text('etcd: {endpoints: ["http://127.0.0.1:9"]}\napi: {token_file: missing-token}\n')
    out = run_cli("run", "--config", str(cfg))
    assert out.returncode == 1
    assert "api.token_file: cannot read" in out.stderr and "Traceback" not in out.stderr


def test_version_and_a_help_that_describes_the_tool() -> None:
    from exporter import __version__

    version = run_cli("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"traefik-etcd-exporter {__version__}"
    shown = run_cli("--help")
    assert shown.returncode == 0 and "compare-guarded etcd transactions" in shown.stdout and "run --embedded" in shown.stdout
    assert "Thin:" not in shown.stdout  # the module's docstring is for developers


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
async def test_healthcheck_asks_the_control_server_the_config_names(tmp_path: Path, etcd: EmbeddedEtcd, tls: bool) -> None:
    from exporter.daemon import Daemon
    from exporter.embedded import free_port
    from tests.helpers import tls_backend_context

    control: dict[str, object] = {"listen": f"127.0.0.1:{free_port()}"}
    if tls:
        tls_backend_context(tmp_path, "control.internal")  # writes server.pem and server.key
        control |= {"tls_cert_file": str(tmp_path / "server.pem"), "tls_key_file": str(tmp_path / "server.key")}
    config = tmp_path / "exporter.yaml"
    config.write_text(
        f'etcd: {{endpoints: ["{etcd.url}"]}}\nrecords_prefix: "{uid("hc")}/records"\napi: {{enabled: false}}\n'
        f"control: {json.dumps(control)}\n"
    )
    dead = await asyncio.to_thread(run_cli, "healthcheck", "--config", str(config))
    assert dead.returncode == 1 and "does not answer" in dead.stderr
    daemon = Daemon(load_settings(config))
    await daemon.start()
    try:
        alive = await asyncio.to_thread(run_cli, "healthcheck", "--config", str(config))
        scheme = "https" if tls else "http"
        assert alive.returncode == 0 and alive.stdout.startswith(f"healthy: {scheme}://{control['listen']}/healthz"), alive.stderr
    finally:
        await daemon.stop()
