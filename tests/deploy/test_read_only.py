"""The daemon writes no file: the compose service runs on a read-only root with no capability.

Docker is not here to prove it, so the daemon itself reports what it writes: a child runs
`traefik-etcd-exporter run` under a Python audit hook (`sys.addaudithook`) that prints every
open for writing, directory made, file renamed or removed. The daemon does a day's work (ingress
files, pushes, active and passive health, the Traefik observer, the leader election, /metrics and
the status page) and stops; nothing may have been written outside /dev.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from exporter.embedded import EmbeddedEtcd, EmbeddedTraefik, free_port
from tests.conftest import access_log_of
from tests.helpers import AUTHORITY, REPO, Backend, eventually, ingress_yaml, is_ready, serves, stop_daemon, uid

pytestmark = pytest.mark.integration
TOKEN = "read-only-test-token"

# Installed in the child before the exporter is imported; reports through fd 2, which it never opens.
HOOK = """
import os, sys
WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
CHANGES = {"os.mkdir", "os.rename", "os.replace", "os.remove", "os.rmdir", "os.symlink", "os.link", "os.truncate",
           "os.chmod", "os.chown", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move"}

def report(event, args):
    path = None
    if event == "open" and not isinstance(args[0], int) and args[0] is not None:
        mode, flags = args[1], args[2]
        if (isinstance(flags, int) and flags & WRITES) or (isinstance(mode, str) and any(c in mode for c in "wax+")):
            path = args[0]
    elif event in CHANGES and not isinstance(args[0], int):
        path = args[0]
    if path is not None:
        os.write(2, ("AUDIT-WRITE " + event + " " + os.fsdecode(path) + "\\n").encode())

sys.addaudithook(report)
"""
AUDITED = HOOK + """
import runpy
sys.argv = ["traefik-etcd-exporter", *sys.argv[1:]]
runpy.run_module("exporter", run_name="__main__", alter_sys=True)
"""


def test_the_hook_reports_what_a_process_writes(tmp_path: Path) -> None:
    target = tmp_path / "written"
    script = HOOK + f"open({str(target)!r}, 'w').close()\nos.mkdir({str(tmp_path / 'made')!r})\n"
    out = subprocess.run([sys.executable, "-B", "-c", script], capture_output=True, text=True, timeout=30).stderr
    assert f"AUDIT-WRITE open {target}" in out and f"AUDIT-WRITE os.mkdir {tmp_path / 'made'}" in out, out


def _config(tmp_path: Path, etcd: EmbeddedEtcd, traefik: EmbeddedTraefik, workdir: Path, backend: Backend) -> dict[str, Any]:
    files = tmp_path / "ingresses"
    files.mkdir()
    return {
        "etcd": {"endpoints": [etcd.url]},
        "records_prefix": f"{uid('ro')}/records",
        "sources": {"files": [str(files / "*.yaml")]},
        "api": {"listen": f"127.0.0.1:{free_port()}"},
        "control": {"listen": f"127.0.0.1:{free_port()}"},
        "traefik": {"api_url": traefik.api, "poll_interval": 0.2},
        "health": {"passive": {"access_log": str(access_log_of(workdir))}},
    }


async def test_a_days_work_writes_no_file(
    tmp_path: Path, etcd: EmbeddedEtcd, traefik: EmbeddedTraefik, workdir: Path, http: aiohttp.ClientSession,
    backends: list[Backend],
) -> None:
    backend = await Backend("read-only").start()
    backends.append(backend)
    settings = _config(tmp_path, etcd, traefik, workdir, backend)
    from_file = tmp_path / "ingresses" / "from-file.yaml"
    file_id = uid("ro-file")
    from_file.write_text(ingress_yaml(file_id, 1, backend.port))
    config = tmp_path / "exporter.yaml"
    config.write_text(yaml.safe_dump(settings))
    proc = subprocess.Popen(
        # -B: an image built from wheels has no bytecode to write either (PYTHONDONTWRITEBYTECODE).
        [sys.executable, "-B", "-c", AUDITED, "run", "--config", str(config)], cwd=REPO,
        env={**os.environ, "EXPORTER_API__TOKEN": TOKEN}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        control, api = f"http://{settings['control']['listen']}", f"http://{settings['api']['listen']}"
        await eventually(lambda: _ready(http, control), timeout=30)
        iid = uid("ro")
        body = {"ingresses": [{"authority": AUTHORITY, "id": iid, "revision": 1, "hosts": [f"{iid}.test"],
                               "upstream": {"servers": [{"url": backend.url}]},
                               "health_check": {"enable": True, "interval": 0.2, "max_wait_time": 0.5, "initial_delay": 0}}]}
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with http.post(f"{api}/v2/ingress/upsert?wait=served", json=body, headers=headers) as resp:
            assert resp.status == 204, await resp.text()
        await eventually(lambda: serves(http, traefik.url("web"), f"{iid}.test", body="read-only"))
        await eventually(lambda: serves(http, traefik.url("web"), f"{file_id}.test", body="read-only"))
        for path in ("/metrics", "/", "/v1/convergence", f"/v1/healthcheck/{AUTHORITY}/{iid}/checkers"):
            async with http.get(control + path, headers=headers) as resp:
                assert resp.status == 200, (path, await resp.text())
        remove = {"ingresses": [{"authority": AUTHORITY, "id": iid, "revision": 1}]}
        async with http.post(f"{api}/v2/ingress/remove", json=remove, headers=headers) as resp:
            assert resp.status == 204
        from_file.unlink()
        await eventually(lambda: serves(http, traefik.url("web"), f"{file_id}.test", status=404))
    finally:
        output = stop_daemon(proc)
    assert proc.returncode == 0, output[-3000:]
    written = [line for line in output.splitlines() if line.startswith("AUDIT-WRITE ")]
    outside = [line for line in written if not re.match(r"AUDIT-WRITE \S+ /dev/", line)]
    assert not outside, outside


async def _ready(http: aiohttp.ClientSession, control: str) -> bool:
    try:
        return await is_ready(http, control)
    except aiohttp.ClientError:
        return False
