"""The systemd unit: `systemd-analyze verify` finds nothing, and it keeps the hardening operators expect."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

UNIT = REPO / "deploy" / "systemd" / "traefik-etcd-exporter.service"


def settings() -> dict[str, list[str]]:
    """The unit's assignments, by name (a name set twice keeps both values)."""
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            name, _, value = line.partition("=")
            out.setdefault(name, []).append(value)
    return out


def test_the_unit_runs_as_a_dedicated_user_with_the_token_as_a_credential_and_hardened() -> None:
    unit = settings()
    assert unit["DynamicUser"] == ["yes"] and unit["User"] == ["traefik-etcd-exporter"]
    assert unit["LoadCredential"] == ["api-token:/etc/traefik-etcd-exporter/api-token"]
    assert "EXPORTER_API__TOKEN_FILE=%d/api-token" in unit["Environment"]
    assert unit["EnvironmentFile"] == ["-/etc/default/traefik-etcd-exporter"]
    assert unit["Restart"] == ["on-failure"]
    for name, value in {"ProtectSystem": "strict", "NoNewPrivileges": "yes", "ProtectHome": "yes", "PrivateTmp": "yes",
                        "CapabilityBoundingSet": "", "RestrictSUIDSGID": "yes"}.items():
        assert unit[name] == [value], name
    assert unit["ExecStart"][0].split()[1:] == ["run", "--config", "/etc/traefik-etcd-exporter/exporter.yaml"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    # Verified as installed: its ExecStart names the installed entry point, here this checkout's.
    entry = Path(sys.executable).parent / "traefik-etcd-exporter"
    text = UNIT.read_text().replace("/opt/traefik-etcd-exporter/bin/traefik-etcd-exporter", str(entry))
    unit = tmp_path / UNIT.name
    unit.write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False)
    # An unknown or misspelt key is only a warning (exit 0): any output at all fails.
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr
