"""Ingress files (YAML, the shape of docs/ingress.md) as a source, hot-reloaded with watchfiles.

Each file is applied as one request: all its changes or none. A file that fails to parse
or validate is reported (log, `errors`, /readyz) and its last good content stays in force.
"""

from __future__ import annotations

import asyncio
import glob
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import yaml
from loguru import logger
from pydantic import ValidationError
from watchfiles import awatch

from ..errors import EtcdUnavailable, ExporterError
from ..ingress import IngressFile, field_errors
from ..keys import IngressRef
from ..store.records import Record, Removal

DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
# libyaml's parser when PyYAML has it: 10x faster on large files.
_YAML_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class RecordSink(Protocol):
    """Where a source delivers its changes (the reconciler)."""

    async def submit(self, upserts: Sequence[Record], removes: Sequence[Removal] = ()) -> None:
        """Commit one request, all or nothing."""
        ...


def load_ingress_file(path: Path, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> list[Record]:
    """Parse and validate one ingress file; raise ExporterError naming the file and every field error."""
    source = f"file:{path}"
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise ExporterError(f"{path}: {size} bytes is more than sources.max_file_bytes ({max_bytes}); split the file")
        data = yaml.load(path.read_text(), Loader=_YAML_LOADER) or {"ingresses": []}
    except (OSError, yaml.YAMLError) as exc:
        raise ExporterError(f"{path}: cannot read YAML: {exc}") from None
    try:
        parsed = IngressFile.model_validate(data)
    except ValidationError as exc:
        errors = field_errors(exc)
        detail = "; ".join(f"{e['loc']}: {e['msg']}" for e in errors)
        raise ExporterError(f"{path}: invalid ingress file: {detail}", {"errors": errors}) from None
    return [Record.of(ingress, source) for ingress in parsed.ingresses]


def expand(globs: list[str]) -> list[Path]:
    """The files the configured globs match now, sorted."""
    return scan(globs)[0]


def scan(globs: list[str]) -> tuple[list[Path], list[str]]:
    """The files the globs match now, sorted, and one warning per pattern that matches none,
    naming the directory it was resolved against (else "no ingress matched" and "rendered to
    nothing" look the same: an empty output)."""
    files: set[Path] = set()
    warnings = []
    for pattern in globs:
        found = {Path(p).resolve() for p in glob.glob(pattern, recursive=True) if Path(p).is_file()}
        if not found:
            directory = _fixed_part(pattern)
            missing = "" if directory.is_dir() else ", which does not exist"
            warnings.append(f"sources.files pattern {pattern!r} matches no file (resolved against {directory}{missing})")
        files |= found
    return sorted(files), warnings


def _fixed_part(pattern: str) -> Path:
    """The directory a glob searches: its segments up to the first one with a wildcard."""
    fixed: list[str] = []
    for part in Path(pattern).parts[:-1]:
        if glob.has_magic(part):
            break
        fixed.append(part)
    return Path(*fixed).absolute() if fixed else Path.cwd()


class IngressFiles:
    """Applies ingress files to a sink and keeps them applied as they change."""

    def __init__(self, globs: list[str], sink: RecordSink, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> None:
        self._globs = globs
        self._sink = sink
        self._max_bytes = max_bytes
        self.applied: dict[Path, dict[IngressRef, Record]] = {}
        self.errors: dict[Path, str] = {}
        # Files whose content is valid but could not be written (etcd down): retried.
        self._unwritten: set[Path] = set()
        # Every file was applied once (readiness waits for it).
        self.synced = False

    async def run(self, committed: Callable[[], list[Record]], stop: asyncio.Event) -> None:
        """Take over what files applied before (`committed`: the records in etcd), apply every file, then follow them."""
        self.adopt(committed())
        await self.sync_all(warn=True)
        self.synced = True
        await self.follow(stop)

    def adopt(self, records: list[Record]) -> None:
        """Take over what files applied before a restart, so files now gone are removed."""
        for record in records:
            if record.source.startswith("file:"):
                self.applied.setdefault(Path(record.source[5:]), {})[record.key] = record

    async def sync_all(self, warn: bool = False) -> None:
        """Apply every matched file, and remove what files that disappeared had applied (`warn`: log
        each pattern that matches no file, as the first sync does)."""
        current, unmatched = scan(self._globs)
        for warning in unmatched if warn else ():
            logger.warning(warning)
        for path in current:
            await self.sync(path)
        for path in [p for p in self.applied if p not in current]:
            await self._apply(path, {})

    async def sync(self, path: Path) -> None:
        """Re-read one file and apply its difference to what it had applied."""
        if not path.exists():
            await self._apply(path, {})
            return
        try:
            records = {r.key: r for r in load_ingress_file(path, self._max_bytes)}
        except ExporterError as exc:
            self.errors[path] = exc.title
            logger.error("{} (its last good content stays in force)", exc.title)
            return
        await self._apply(path, records)

    async def _apply(self, path: Path, records: dict[IngressRef, Record]) -> None:
        before = self.applied.get(path, {})
        upserts = [r for k, r in records.items() if before.get(k) is None or before[k].content != r.content]
        removes = [Removal(k, r.revision) for k, r in before.items() if k not in records]
        try:
            if upserts or removes or path not in self.applied:
                await self._sink.submit(upserts, removes)
        except EtcdUnavailable as exc:
            if path not in self._unwritten:
                logger.warning("{}: not applied yet, will retry: {}", path, exc.title)
            self.errors[path] = exc.title
            self._unwritten.add(path)
            return
        except ExporterError as exc:
            self.errors[path] = exc.title
            self._unwritten.discard(path)
            logger.error("{}: not applied: {}", path, exc.title)
            return
        self.errors.pop(path, None)
        self._unwritten.discard(path)
        if records:
            self.applied[path] = records
        else:
            self.applied.pop(path, None)
        if upserts or removes:
            logger.info("{}: applied {} upserts, {} removes", path, len(upserts), len(removes))

    async def follow(self, stop: asyncio.Event, retry_interval: float = 1.0) -> None:
        """Follow file changes and retry unwritten files until `stop` is set (after `sync_all`).

        One task group: a crash of either part ends both and reaches the caller's supervisor.
        """
        async with asyncio.TaskGroup() as group:
            group.create_task(self._retry(stop, retry_interval))
            group.create_task(self._watch_until(stop))

    async def _watch_until(self, stop: asyncio.Event) -> None:
        await self.watch(stop)
        await stop.wait()

    async def _retry(self, stop: asyncio.Event, interval: float) -> None:
        while not stop.is_set():
            await asyncio.sleep(interval)
            for path in sorted(self._unwritten):
                await self.sync(path)

    async def watch(self, stop: asyncio.Event) -> None:
        """Re-apply files as they change until `stop` is set."""
        dirs = sorted({str(Path(g).parent) for g in self._globs if Path(g).parent.exists()})
        if not dirs:
            return
        async for _changes in awatch(*dirs, stop_event=stop, debounce=100, step=20):
            # Globs may match new files; re-evaluate all of them (cheap: unchanged files are no-ops).
            await self.sync_all()
