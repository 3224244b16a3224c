"""The picture of a real trace in docs/operations.md: one push, from its request to Traefik serving it.

Starts etcd and Traefik (the embedded binaries), a loopback OTLP receiver and a daemon
exporting to it; puts `--in-place` ingresses in place (so Traefik's rebuild takes as long as
it does at that size), then pushes one more with a `traceparent` and `?wait=served`. Prints
the trace as a text waterfall and writes it as an SVG.

Usage: .venv/bin/python -m tests.trace_picture [--in-place 2000] [--svg docs/traces-push.svg]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import tempfile
from pathlib import Path
from xml.sax.saxutils import escape

import aiohttp

from exporter.config import Settings
from exporter.daemon import Daemon
from exporter.embedded import free_port, start_etcd, start_traefik
from tests.helpers import eventually
from tests.otlp_receiver import ReceivedSpan, grpc_receiver

TOKEN = "picture-token"
ROOT_KEY = "picture/worker_{authority}"
_WIDTH, _LABEL, _ROW = 900, 230, 24


def _ingress(n: int, port: int) -> dict[str, object]:
    return {"authority": "pic", "id": f"model-{n}", "revision": 1, "hosts": [f"model-{n}.test"],
            "upstream": {"servers": [{"url": f"http://127.0.0.1:{port}"}]}}


async def trace_of_one_push(in_place: int) -> list[ReceivedSpan]:
    """The spans of one traced push with `in_place` ingresses already served."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        etcd = start_etcd(work)
        traefik = start_traefik(work, etcd.url, ROOT_KEY.format(authority="pic"), ["web"])
        try:
            async with grpc_receiver() as receiver, aiohttp.ClientSession() as http:
                api = f"127.0.0.1:{free_port()}"
                daemon = Daemon(Settings.model_validate({
                    "etcd": {"endpoints": [etcd.url]}, "root_key": ROOT_KEY, "api": {"listen": api, "token": TOKEN},
                    "control": {"listen": f"127.0.0.1:{free_port()}"}, "traefik": {"api_url": traefik.api},
                    "otel": {"enabled": True, "endpoint": receiver.endpoint},
                }))
                await daemon.start()
                headers = {"Authorization": f"Bearer {TOKEN}"}
                try:
                    await daemon.parts.reconciler.wait_synced(30)
                    for start in range(0, in_place, 500):
                        body = {"ingresses": [_ingress(n, 9000 + n % 1000) for n in range(start, min(in_place, start + 500))]}
                        async with http.post(f"http://{api}/v2/ingress/upsert?wait=served", json=body, headers=headers) as resp:
                            assert resp.status == 204, await resp.text()
                    trace_id = secrets.token_hex(16)
                    traced = {**headers, "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}
                    body = {"ingresses": [_ingress(in_place, 9999)]}
                    async with http.post(f"http://{api}/v2/ingress/upsert?wait=served", json=body, headers=traced) as resp:
                        assert resp.status == 204, await resp.text()

                    async def whole() -> list[ReceivedSpan] | None:
                        spans = receiver.of_trace(trace_id)
                        if not {"traefik served", "POST /v2/ingress/upsert"} <= {s.name for s in spans}:
                            return None
                        # The batch that wrote the push: a trace of its own, linked from the push's span.
                        batches = [receiver.of_trace(link[0]) for s in spans for link in s.links if s.name.startswith("POST")]
                        if not all({"write batch", "etcd Txn"} <= {s.name for s in batch} for batch in batches):
                            return None
                        return spans + [s for batch in batches for s in batch]

                    return await eventually(whole, timeout=30)
                finally:
                    await daemon.stop()
        finally:
            traefik.stop()
            etcd.stop()


def rows_of(spans: list[ReceivedSpan]) -> list[tuple[str, int, int, str]]:
    """One row per span, and one per event of a span (a mark, named with a dot): label, start, end, colour."""
    rows = []
    for s in sorted(spans, key=lambda s: (s.start_ns, -s.end_ns)):
        color = "#c0392b" if s.error else "#2e86c1" if s.kind == 2 else "#27ae60" if s.kind == 3 else "#8e44ad"
        rows.append((s.name, s.start_ns, s.end_ns, color))
        rows.extend((f"  . {name}", at, at, "#7f8c8d") for name, _attributes, at in s.events)
    return rows


def waterfall(spans: list[ReceivedSpan]) -> str:
    """The trace as text: each span's (and event's) offset from the push's start, its duration and a bar."""
    rows = rows_of(spans)
    start, end = min(r[1] for r in rows), max(r[2] for r in rows)
    scale = 60 / max(1, end - start)
    lines = []
    for name, first, last, _color in rows:
        left = int((first - start) * scale)
        bar = "#" * max(1, int((last - first) * scale))
        lines.append(f"{name:24s} +{(first - start) / 1e6:8.2f} ms {(last - first) / 1e6:8.2f} ms  {' ' * left}{bar}")
    return "\n".join(lines)


def svg(spans: list[ReceivedSpan]) -> str:
    """The trace as an SVG waterfall (one row per span or event, time to the right)."""
    rows_drawn = rows_of(spans)
    start, end = min(r[1] for r in rows_drawn), max(r[2] for r in rows_drawn)
    scale = (_WIDTH - _LABEL - 20) / max(1, end - start)
    height = _ROW * (len(rows_drawn) + 1) + 10
    rows = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" font-family="sans-serif" font-size="12">',
            f'<rect width="{_WIDTH}" height="{height}" fill="white"/>']
    for k, (name, first, last, color) in enumerate(rows_drawn):
        y = 10 + k * _ROW
        x = _LABEL + (first - start) * scale
        w = max(2.0, (last - first) * scale)
        label = f"{name} ({(last - first) / 1e6:.1f} ms)" if last > first else name
        rows.append(f'<text x="4" y="{y + 15}">{escape(label)}</text>')
        rows.append(f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{_ROW - 8}" fill="{color}"/>')
    axis = 10 + len(rows_drawn) * _ROW + 14
    rows.append(f'<text x="{_LABEL}" y="{axis}">0 ms</text>')
    rows.append(f'<text x="{_WIDTH - 20}" y="{axis}" text-anchor="end">{(end - start) / 1e6:.0f} ms</text>')
    rows.append("</svg>")
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--in-place", type=int, default=2000)
    parser.add_argument("--svg", type=Path, default=Path("docs/traces-push.svg"))
    args = parser.parse_args()
    spans = asyncio.run(trace_of_one_push(args.in_place))
    print(waterfall(spans))
    args.svg.write_text(svg(spans))
    print(f"written: {args.svg}")


if __name__ == "__main__":
    main()
