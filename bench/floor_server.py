"""The ceiling of push throughput: a server that batches pushes as the exporter does and does only part of its work.

Each `POST /v2/ingress/upsert` is
- `parsed`: read with orjson, nothing checked; its keys are the servers' URLs and its record;
- `validated`: validated as the exporter validates it and made its stored record (the
  exporter's own models), the same keys;
- `rendered`: that, rendered by the exporter's renderer and diffed against a mirror of etcd:
  the keys that changed and the record.
The write loop takes what is queued, waiting (at most 20 ms) until as many requests as the
last batch answered are back (the exporter's rule), writes them as transactions of at most
127 puts sent at once through the exporter's etcd client, and answers each request 204 once
they commit. Two watches (the roots and the records, as the exporter's mirror keeps) are
read and decoded into the mirror. No compares, intents, ledger, health or metrics: what is
left of the exporter when its bookkeeping is taken away, in a process of its own with the
daemon's collector thresholds.

Usage (by bench/push_api.py --only floor): python -m bench.floor_server <etcd url> <host:port> <parsed|validated|rendered>
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from bench.common import RECORDS, ROOT_KEY
from exporter.etcd.client import EtcdClient
from exporter.etcd.types import Op
from exporter.gc_tuning import tune_gc
from exporter.ingress import UpsertRequest
from exporter.keys import IngressRef, KeyLayout
from exporter.render.renderer import Renderer
from exporter.store.records import Record, stored_value

WORK = ("parsed", "validated", "rendered")
_WINDOW = 0.02
_OPS = 127

_LAYOUT = KeyLayout(ROOT_KEY, RECORDS)


def _server_puts(ref: IngressRef, urls: list[str], record: str) -> list[Op]:
    """The puts of an ingress whose servers' URLs changed: each URL (the layout the renderer writes) and its record."""
    service = f"{_LAYOUT.root(ref.authority)}/http/services/{_LAYOUT.object_name(ref)}/loadBalancer/servers"
    return [*(Op(f"{service}/{i:03d}/url", url) for i, url in enumerate(urls)), Op(_LAYOUT.record_key(ref), record)]


@dataclass
class Floor:
    """The queue of requests (their puts, and the future each is answered by) and the mirror."""

    work: str
    etcd: EtcdClient
    renderer: Renderer = field(default_factory=lambda: Renderer(_LAYOUT, ["web"]))
    mirror: dict[str, str] = field(default_factory=dict)
    queue: list[tuple[list[Op], asyncio.Future[None]]] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    last_batch: int = 0

    def puts(self, raw: bytes) -> list[Op]:
        """What one request writes, after the work it is given."""
        ops: list[Op] = []
        if self.work == "parsed":
            for ingress in orjson.loads(raw)["ingresses"]:
                urls = [s["url"] for s in ingress["upstream"]["servers"]]
                value = stored_value(orjson.dumps(ingress).decode(), "api")
                ops += _server_puts(IngressRef(ingress["authority"], ingress["id"]), urls, value)
            return ops
        records = [Record.of(ingress) for ingress in UpsertRequest.model_validate_json(raw).ingresses]
        if self.work == "validated":
            for r in records:
                servers = r.ingress.upstream.servers  # type: ignore[union-attr]  # the bench's are `servers`
                ops += _server_puts(r.key, [s.url for s in servers], r.value)
            return ops
        for record in records:
            kv = self.renderer.render(record.ingress, frozenset(), record.value).kv
            ops += [Op(k, v) for k, v in kv.items() if self.mirror.get(k) != v]
            ops.append(Op(_LAYOUT.record_key(record.key), record.value))
        return ops

    async def upsert(self, request: web.Request) -> web.Response:
        """Queue the request's puts; answer once they commit."""
        future = asyncio.get_running_loop().create_future()
        self.queue.append((self.puts(await request.read()), future))
        self.wake.set()
        await future
        return web.Response(status=204)

    async def write(self) -> None:
        """The write loop: one batch at a time."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            deadline = time.monotonic() + _WINDOW
            while len(self.queue) < self.last_batch and (remaining := deadline - time.monotonic()) > 0:
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), remaining)
                except TimeoutError:
                    break
            batch, self.queue = self.queue, []
            self.last_batch = len(batch)
            ops = [op for puts, _ in batch for op in puts]
            await asyncio.gather(*(self.etcd.txn([], ops[i : i + _OPS]) for i in range(0, len(ops), _OPS)))
            for _, future in batch:
                future.set_result(None)

    async def watch(self, prefix: str) -> None:
        """Keep the mirror of `prefix` from the watch."""
        async for events in self.etcd.watch_prefix(prefix, 1, 60):
            for event in events:
                value = event.value
                if value is None:
                    self.mirror.pop(event.key, None)
                else:
                    self.mirror[event.key] = value


async def serve(etcd_url: str, listen: str, work: str) -> None:
    """Serve the push API's upsert (and the listing `wait_up` polls) until killed."""
    floor = Floor(work, EtcdClient([etcd_url]))

    async def listing(_request: web.Request) -> web.Response:
        return web.json_response({"ingresses": []})

    app = web.Application()
    app.router.add_post("/v2/ingress/upsert", floor.upsert)
    app.router.add_get("/v2/ingress", listing)
    tasks = [asyncio.create_task(floor.write()), asyncio.create_task(floor.watch(_LAYOUT.roots_prefix)),
             asyncio.create_task(floor.watch(_LAYOUT.records_dir))]
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, port = listen.rsplit(":", 1)
    await web.TCPSite(runner, host, int(port)).start()
    await asyncio.gather(*tasks)


if __name__ == "__main__":
    tune_gc()
    asyncio.run(serve(sys.argv[1], sys.argv[2], sys.argv[3]))
