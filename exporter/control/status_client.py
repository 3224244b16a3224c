"""`traefik-etcd-exporter status`: the running daemon's overview, convergence and unhealthy ingresses, as text.

Read from its control server (`/ui/state.json`), for operators on a host without a browser.
Exit 0 when everything is served and every server is in rotation, 2 when something is not,
1 when the daemon does not answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from ..config import Settings

EXIT_OK, EXIT_UNREACHABLE, EXIT_NOT_SERVED = 0, 1, 2
_PAGES_MAX = 1000


def control_url(settings: Settings) -> str:
    """The control server as a client on this host reaches it (a wildcard listen address is reached on loopback)."""
    host, _, port = settings.control.listen.rpartition(":")
    if host.strip("[]") in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    scheme = "https" if settings.control.tls_cert_file else "http"
    return f"{scheme}://{host}:{port}"


async def fetch(settings: Settings, timeout: float = 10.0) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The state, and every ingress not served or with a server out of rotation (all pages)."""
    token = settings.secret("api.token")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    base = control_url(settings)
    bad: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout), headers=headers) as session:
        page, state = 1, {}
        while page <= _PAGES_MAX:
            async with session.get(f"{base}/ui/state.json", params={"bad": "1", "page": str(page)}) as resp:
                resp.raise_for_status()
                state = await resp.json()
            bad += state["page"]["rows"]
            if page >= state["page"]["pages"]:
                break
            page += 1
    return state, bad


def format_status(state: dict[str, Any], bad: list[dict[str, Any]]) -> str:
    """The text `status` prints."""
    o = state["overview"]
    flag = {True: "yes", False: "no", None: "unknown"}
    lines = [
        f"traefik-etcd-exporter {o['version']}: {o['role']}" + (f" (leader {o['leader']})" if o.get("leader") else ""),
        f"etcd reachable: {flag[o['etcd_reachable']]}; discovery registered: {flag[o['discovery_registered']]}; "
        f"ready: {flag[o['ready']]}",
        *(f"  not ready: {r}" for r in o["reasons"]),
        f"ingresses {o['ingresses']}: served {o['served']}, pending {o['pending']}, refused {o['refused']}; "
        f"servers routable {o['servers_routable']}, out of rotation {o['servers_ejected']}",
    ]
    for root in state["roots"]:
        lines.append(f"root {root['root']}: {root['state']} (committed {root['committed_revision']}, "
                     f"applied {root['applied_revision']}, lag {root['lag_seconds']} s)")
        lines += [f"  blocking: {advice}" for advice in root["advice"]]
    for row in bad:
        what = "refused: " + "; ".join(row["errors"]) if row["errors"] else "pending" if row["pending"] else (
            "not served" if row["served"] is False else "served")
        out = [s["url"] for s in row["servers"] if not s["routed"]]
        lines.append(f"ingress {row['authority']}/{row['id']} r{row['revision']}: {what}"
                     + (f"; out of rotation: {', '.join(out)}" if out else ""))
    return "\n".join(lines) + "\n"


def status(settings: Settings) -> tuple[int, str]:
    """The exit code and the text of `status`."""
    try:
        state, bad = asyncio.run(fetch(settings))
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
        return EXIT_UNREACHABLE, f"error: the daemon's control server at {control_url(settings)} does not answer ({type(exc).__name__})\n"
    unhealthy = bad or any(r["state"] != "converged" for r in state["roots"])
    return (EXIT_NOT_SERVED if unhealthy else EXIT_OK), format_status(state, bad)
