"""Replay etcd history and check invariant 1 at every revision: no router references a missing object."""

from __future__ import annotations

import base64
import json
from collections import defaultdict

import aiohttp


def dangling(kv: dict[str, str], root: str) -> list[str]:
    """Every reference under `root` to a router/service/middleware/transport that does not exist."""
    present: dict[str, set[str]] = defaultdict(set)
    refs: list[tuple[str, str, str]] = []  # (referrer key, kind, name)
    cut = len(root) + 1
    for key, value in kv.items():
        if not key.startswith(root + "/"):
            continue
        parts = key[cut:].split("/")
        if len(parts) < 4 or parts[0] not in ("http", "tcp"):
            continue
        proto, kind, _name, field = parts[0], parts[1], parts[2], parts[3:]
        present[f"{proto}/{kind}"].add(parts[2])
        if kind == "routers" and field == ["service"]:
            refs.append((key, f"{proto}/services", value))
        elif kind == "routers" and field[0] == "middlewares":
            refs.append((key, f"{proto}/middlewares", value))
        elif kind == "services" and field[-1] == "serversTransport":
            refs.append((key, f"{proto}/serversTransports", value))
        elif kind == "services" and field[0] == "weighted" and field[-1] == "name":
            refs.append((key, f"{proto}/services", value))
    return [f"{key} -> {name}" for key, kind, name in refs if "@" not in name and name not in present[kind]]


SHARED = "shared"


def owner_of(key: str, root: str) -> str:
    """The ingress (`<authority>_<id>`) an exporter key under `root` belongs to; `shared` for a shared object's."""
    parts = key[len(root) + 1 :].split("/")
    name = parts[2] if len(parts) > 2 else ""
    if name.startswith("shared-") and "_" not in name:
        return SHARED
    return "_".join(name.split("_", 2)[:2])


def touched_views(by_owner: dict[str, dict[str, str]], touched: set[str]) -> list[dict[str, str]]:
    """The key sets to check after a revision that touched `touched` owners: each ingress with the shared
    objects it may name; every ingress when a shared object changed (its referrers are anywhere)."""
    shared = by_owner.get(SHARED, {})
    owners = [o for o in by_owner if o != SHARED] if SHARED in touched else [o for o in touched if o != SHARED]
    return [{**by_owner.get(owner, {}), **shared} for owner in sorted(owners)]


def _unb64(data: str | None) -> str:
    return base64.b64decode(data).decode() if data else ""


def _b64(data: str) -> str:
    return base64.b64encode(data.encode()).decode()


def _range_end(prefix: str) -> str:
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return base64.b64encode(bytes(raw)).decode()


async def replay(etcd_url: str, root: str, start: int) -> tuple[list[str], int]:
    """Check every revision after `start` up to now: (violations found, revisions checked).

    A marker key written under the root ends the history read: its event is the last one.
    """
    prefix = root + "/"
    marker = f"{root}/_meta/replay-marker"
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{etcd_url}/v3/kv/put", json={"key": _b64(marker), "value": _b64("1")}) as resp:
            end = int((await resp.json())["header"]["revision"])
        async with session.post(f"{etcd_url}/v3/kv/deleterange", json={"key": _b64(marker)}) as resp:
            resp.raise_for_status()
        body = {"key": _b64(prefix), "range_end": _range_end(prefix), "revision": str(start)}
        async with session.post(f"{etcd_url}/v3/kv/range", json=body) as resp:
            state = {_unb64(kv["key"]): _unb64(kv.get("value")) for kv in (await resp.json()).get("kvs", [])}
        violations = [f"rev {start}: {d}" for d in dangling(state, root)]
        by_rev: dict[int, list[tuple[str, str | None]]] = defaultdict(list)
        if end > start:
            watch = {"create_request": {"key": _b64(prefix), "range_end": _range_end(prefix), "start_revision": str(start + 1)}}
            async with session.post(f"{etcd_url}/v3/watch", json=watch, timeout=aiohttp.ClientTimeout(total=120)) as resp:
                done = False
                while line := await resp.content.readline(max_line_length=256 * 1024 * 1024):
                    result = json.loads(line).get("result", {})
                    for ev in result.get("events") or []:
                        rev = int(ev["kv"]["mod_revision"])
                        if rev >= end:
                            done = True
                            continue
                        value = None if ev.get("type") == "DELETE" else _unb64(ev["kv"].get("value"))
                        by_rev[rev].append((_unb64(ev["kv"]["key"]), value))
                    if done:
                        break
        # Exporter objects reference objects of their own ingress (`<authority>_<id>*`) and shared
        # ones, so each revision is checked on the ingresses it touched: cost follows the change.
        by_owner: dict[str, dict[str, str]] = defaultdict(dict)
        for key, value in state.items():
            by_owner[owner_of(key, root)][key] = value
        for rev in sorted(by_rev):
            touched = set()
            for key, value in by_rev[rev]:
                owner = owner_of(key, root)
                touched.add(owner)
                if value is None:
                    by_owner[owner].pop(key, None)
                else:
                    by_owner[owner][key] = value
            for view in touched_views(by_owner, touched):
                violations += [f"rev {rev}: {d}" for d in dangling(view, root)]
        return violations, len(by_rev)
