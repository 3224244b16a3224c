"""The floor of any push-to-commit: an aiohttp server that answers each POST after one bare etcd txn.

No validation, render, plan, compare or watch: only the two HTTP hops every push makes (the
coordinator to the exporter, the exporter to etcd's gateway), in a process of its own as the
daemon is, with the daemon's collector thresholds.

Usage (by bench/push_api.py): python -m bench.relay <etcd url> <port>
"""

from __future__ import annotations

import asyncio
import sys

import aiohttp
from aiohttp import web

from exporter.etcd.types import Op, txn_body
from exporter.gc_tuning import tune_gc


async def serve(etcd_url: str, port: int) -> None:
    """Serve POST /push until killed."""
    session = aiohttp.ClientSession()
    count = 0

    async def push(request: web.Request) -> web.Response:
        nonlocal count
        await request.read()
        count += 1
        body = txn_body([], [Op(f"bench-relay/{count}", "x")])
        async with session.post(f"{etcd_url}/v3/kv/txn", data=body, headers={"Content-Type": "application/json"}) as resp:
            await resp.read()
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/push", push)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    tune_gc()
    asyncio.run(serve(sys.argv[1], int(sys.argv[2])))
