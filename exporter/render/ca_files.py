"""Upstream CA files (`upstream_tls.ca_file`): read, checked, watched, and rewritten when they rotate.

A file must lie in one of `upstream.ca_file_dirs` (a projected secret, e.g. `/run/secrets`): a push
cannot make the sidecar read anything else. Its content must be one or more PEM certificates;
only then does it become the file's content, written into the transports of the ingresses that
name it. A file that goes missing or turns invalid keeps its last good content (never written:
Traefik keeps trusting the CA it had), and is reported by `problems()` (so `/readyz`) and
`exporter_upstream_ca_file_ok{path}`. `watch` follows the directories of the files in use with
watchfiles and calls back with each file whose good content changed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from cryptography import x509
from loguru import logger
from watchfiles import awatch

from ..ingress.bounds import MAX_CA_PEM_BYTES
from ..metrics import Sample


class CaFiles:
    """The last good content of every CA file in use, and what is wrong with those that are not good now."""

    def __init__(self, dirs: Sequence[Path] = ()) -> None:
        self._dirs = tuple(str(d).rstrip("/") + "/" for d in dirs)
        self._good: dict[str, str] = {}
        self._versions: dict[str, int] = {}
        self._problems: dict[str, str] = {}

    def allowed(self, path: str) -> bool:
        """True when `path` lies in one of the configured directories."""
        return any(path.startswith(d) for d in self._dirs)

    def problem(self, path: str) -> str | None:
        """Why `path` cannot be used now (None: it has good content); reads it the first time."""
        if not self.allowed(path):
            allowed = ", ".join(d.rstrip("/") for d in self._dirs) or "none configured"
            return f"is not in upstream.ca_file_dirs ({allowed})"
        if path not in self._good and path not in self._problems:
            self.refresh(path)
        return None if path in self._good else self._problems.get(path, "has no valid content yet")

    def content(self, path: str) -> str | None:
        """The last good content of `path` (None: never good)."""
        if path not in self._good and path not in self._problems and self.allowed(path):
            self.refresh(path)
        return self._good.get(path)

    def version(self, path: str) -> int:
        """A number that changes whenever the good content of `path` does (part of the render cache key)."""
        return self._versions.get(path, 0)

    def refresh(self, path: str) -> bool:
        """Read `path` again; True when its good content changed."""
        try:
            data = Path(path).read_bytes()[: MAX_CA_PEM_BYTES + 1]
            if len(data) > MAX_CA_PEM_BYTES:
                raise ValueError(f"is larger than {MAX_CA_PEM_BYTES} bytes")
            text = data.decode("ascii")
            if not x509.load_pem_x509_certificates(data):
                raise ValueError("holds no PEM certificate")
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            problem = _describe(exc)
            if self._problems.get(path) != problem:
                kept = "keeping the last good content" if path in self._good else "not written"
                logger.error("upstream CA file {} {}: {}", path, problem, kept)
            self._problems[path] = problem
            return False
        if path in self._problems:
            logger.info("upstream CA file {} is valid again", path)
        self._problems.pop(path, None)
        if self._good.get(path) == text:
            return False
        self._good[path] = text
        self._versions[path] = self._versions.get(path, 0) + 1
        return True

    def states(self) -> list[Sample]:
        """Per CA file in use: 1 while its content is good, 0 while it is not (the gauge, read at scrape)."""
        return [((path,), 0.0 if path in self._problems else 1.0) for path in sorted({*self._good, *self._problems})]

    def problems(self) -> list[str]:
        """What `/readyz` says about CA files in use that are not good now."""
        return [f"upstream CA file {path} {problem}" for path, problem in sorted(self._problems.items())]

    def forget(self, in_use: Iterable[str]) -> None:
        """Drop what is known of files no ingress names any more."""
        keep = set(in_use)
        for path in [p for p in {*self._good, *self._problems} if p not in keep]:
            self._good.pop(path, None)
            self._problems.pop(path, None)
            self._versions.pop(path, None)

    async def watch(self, in_use: Callable[[], set[str]], changed: Callable[[str], None], stop: asyncio.Event) -> None:
        """Until `stop`: re-read the files in use when their directories change (and at least every second)."""
        while not stop.is_set():
            paths = in_use()
            self.forget(paths)
            dirs = sorted({str(Path(p).parent) for p in paths if Path(p).parent.is_dir()})
            if not dirs:
                await _wait(stop, 1.0)
            else:
                async for _changes in awatch(*dirs, stop_event=stop, yield_on_timeout=True, rust_timeout=1000, debounce=50):
                    break
            for path in sorted(paths):
                if self.refresh(path):
                    changed(path)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "does not exist"
    if isinstance(exc, PermissionError):
        return "is not readable"
    if isinstance(exc, IsADirectoryError):
        return "is a directory"
    if isinstance(exc, UnicodeDecodeError):
        return "is not PEM text"
    if isinstance(exc, ValueError):
        text = str(exc)
        return text if text.startswith(("is ", "holds ")) else "holds no valid PEM certificate"
    return f"cannot be read ({type(exc).__name__})"


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return
