"""Command line: `run`, `diff`, `render`, `status`. Thin: parses arguments and calls into the package."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from loguru import logger

from . import __version__
from .config import Settings, load_settings
from .errors import ExporterError, StaleRevisionError
from .keys import IngressRef
from .plan.format import format_plan
from .plan.plan import Plan
from .store.records import Record
from .store.revisions import classify_upsert

EXIT_OK, EXIT_ERROR, EXIT_DIFF = 0, 1, 2


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(Path(args.config) if args.config else None)


def _file_records(settings: Settings, extra: list[str]) -> list[Record]:
    from .sources.files import load_ingress_file, scan

    paths, unmatched = scan(settings.sources.files + extra)
    for warning in unmatched:
        print(f"WARNING: {warning}", file=sys.stderr)
    records: dict[IngressRef, Record] = {}
    for path in paths:
        for record in load_ingress_file(path, settings.sources.max_file_bytes):
            if record.key in records:
                raise ExporterError(f"{path}: ingress {record.key} is declared in two files")
            records[record.key] = record
    return list(records.values())


async def _diff(settings: Settings) -> tuple[Plan, list[str]]:
    from .assembly import build_reconciler, etcd_client

    async with etcd_client(settings) as etcd:
        reconciler = build_reconciler(settings, etcd, dry_run=True)
        await reconciler.load()
        files = _file_records(settings, [])
        warnings = []
        upserts = []
        for record in files:
            try:
                if classify_upsert(reconciler.store.get(record.key), record) == "apply":
                    upserts.append(record)
            except StaleRevisionError as exc:
                warnings.append(exc.title)
        declared = {r.key for r in files}
        removes = [
            r.key for r in reconciler.store.by_authority() if r.source.startswith("file:") and r.key not in declared
        ]
        plan = reconciler.preview(upserts, removes)
        warnings += [f"{ref}: {error.title}" for ref, error in sorted(reconciler.render_errors.items())]
        return plan, warnings


def cmd_diff(args: argparse.Namespace) -> int:
    """Print the key diff between what the sources render to and live etcd."""
    settings = _settings(args)
    plan, warnings = asyncio.run(_diff(settings))
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    sys.stdout.write(format_plan(plan, color=sys.stdout.isatty() and not args.no_color))
    return EXIT_DIFF if not plan.empty else EXIT_OK


def cmd_render(args: argparse.Namespace) -> int:
    """Print the KV the ingress files render to, without etcd."""
    from .assembly import renderer_for
    from .render.root_keys import load_certificate, root_keys

    settings = _settings(args)
    layout = settings.layout()
    renderer = renderer_for(settings, layout)
    certificate = load_certificate(settings.tls.cert_file, settings.tls.key_file)
    out: dict[str, str] = {}
    records = _file_records(settings, args.files)
    for root in sorted({layout.root(r.key.authority) for r in records}):
        for key, value in root_keys(root, certificate).items():
            out[key] = "<generated certificate>" if certificate.generated and "defaultCertificate" in key else value
    for record in records:
        rendered = renderer.render(record.ingress, cache_key=record.value)
        out.update(rendered.kv)
        for shared in rendered.shared:
            out.update(shared.kv)
    for authority in sorted({r.key.authority for r in records}):
        # Free-text authorities stay verbatim in keys; object names use a safe label (docs/ingress.md).
        label = layout.object_label(authority)
        print(f"# authority {authority!r}: root {layout.root(authority)}, object names {label}_<id>[_<suffix>]")
    for key in sorted(out):
        print(f"{key} = {out[key]}".replace("\n", "\\n"))
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    """Run the daemon (or the embedded first-run demo)."""
    from .daemon import Daemon
    from .gc_tuning import tune_gc
    from .logs import setup_logging

    tune_gc()
    if args.embedded:
        from .embedded_demo import run_embedded

        return asyncio.run(run_embedded(Path(args.config) if args.config else None))
    settings = _settings(args)
    setup_logging(settings.log)

    async def main() -> None:
        await Daemon(settings, dry_run=args.dry_run).run_until_signal()

    asyncio.run(main())
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    """Print the running daemon's overview, convergence and unhealthy ingresses."""
    from .control.status_client import status

    code, text = status(_settings(args))
    (sys.stdout if code != 1 else sys.stderr).write(text)
    return code


def cmd_healthcheck(args: argparse.Namespace) -> int:
    """Exit 0 when the daemon's control server answers /healthz with 200, 1 otherwise."""
    from .control.liveness import healthcheck

    code, text = healthcheck(_settings(args))
    (sys.stdout if code == 0 else sys.stderr).write(text)
    return code


def cmd_config_reference(_args: argparse.Namespace) -> int:
    """Print the configuration reference (docs/configuration.md)."""
    from .config.reference import reference_markdown

    sys.stdout.write(reference_markdown())
    return EXIT_OK


def cmd_openapi(args: argparse.Namespace) -> int:
    """Print the push API's OpenAPI document: the published contract (docs/openapi.yaml), or with
    --config this sidecar's own (its timeout bounds, plugin kinds, CA directories, wait=served)."""
    from .sources.contract import openapi_yaml

    if args.config is None:
        sys.stdout.write(openapi_yaml())
        return EXIT_OK
    from .health.checkers import load_kinds
    from .health.kinds import BUILTIN

    settings = load_settings(Path(args.config))
    builtin = {k.kind for k in BUILTIN}
    sys.stdout.write(openapi_yaml(settings, [k for k in load_kinds(BUILTIN) if k not in builtin]))
    return EXIT_OK


_DESCRIPTION = """\
Keeps Traefik's etcd configuration equal to the ingresses a coordinator pushes (or ingress
files declare): minimal, atomic, compare-guarded etcd transactions, upstreams health-checked
by the exporter itself, what Traefik serves confirmed through its API.

Start with `run --embedded` (etcd, Traefik and example backends as children), read
`diff` before trusting a configuration, `render` to see the keys of ingress files.
Configuration: exporter.yaml or EXPORTER_<SECTION>__<FIELD> (`config-reference` lists them).
"""


def parser() -> argparse.ArgumentParser:
    """The argument parser."""
    p = argparse.ArgumentParser(
        prog="traefik-etcd-exporter", description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("--config", "-c", help="exporter.yaml")
    run.add_argument("--dry-run", action="store_true", help="compute and log every diff, never write")
    run.add_argument(
        "--embedded", action="store_true", help="start etcd, Traefik and example backends as children (first run)"
    )
    run.set_defaults(func=cmd_run)
    diff = sub.add_parser("diff", help="print the key diff against live etcd (exit 0 none, 2 diff, 1 error)")
    diff.add_argument("--config", "-c", help="exporter.yaml")
    diff.add_argument("--no-color", action="store_true")
    diff.set_defaults(func=cmd_diff)
    render = sub.add_parser("render", help="print the KV that ingress files render to, without etcd")
    render.add_argument("--config", "-c", help="exporter.yaml")
    render.add_argument("files", nargs="*", help="ingress files (in addition to the config's sources)")
    render.set_defaults(func=cmd_render)
    status = sub.add_parser(
        "status", help="the running daemon's state, roots and unhealthy ingresses (exit 0 all served, 2 not, 1 unreachable)"
    )
    status.add_argument("--config", "-c", help="exporter.yaml")
    status.set_defaults(func=cmd_status)
    health = sub.add_parser(
        "healthcheck", help="exit 0 when the daemon the config describes answers /healthz (a container's HEALTHCHECK), 1 otherwise"
    )
    health.add_argument("--config", "-c", help="exporter.yaml")
    health.set_defaults(func=cmd_healthcheck)
    reference = sub.add_parser("config-reference", help="print the configuration reference as Markdown")
    reference.set_defaults(func=cmd_config_reference)
    openapi = sub.add_parser("openapi", help="print the push API's OpenAPI document (with --config: this sidecar's own)")
    openapi.add_argument("--config", "-c", help="exporter.yaml")
    openapi.set_defaults(func=cmd_openapi)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    args = parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except ExporterError as exc:
        print(f"error: {exc.title}", file=sys.stderr)
        for item in exc.data.get("errors", []):
            print(f"  {item.get('loc')}: {item.get('msg')}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        logger.info("interrupted")
        return EXIT_OK
    return code


if __name__ == "__main__":
    sys.exit(main())
