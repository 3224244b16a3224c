"""Objects shared by content within a root: the edge middlewares and the servers transports.

Traefik's KV decoder finds each key's parent among its siblings by a linear scan, so a category
costs about (keys per object) x (objects in it)^2 / 2 comparisons on every etcd revision under
the root (docs/performance.md, "What a change costs Traefik"). An ingress that carried its own
allowlist, limits, retry and transport added six objects to those categories; ingresses whose
definitions are equal now reference one object, named from its content: `shared-<kind>-<hash>`.

Sharing does not share state: Traefik builds a middleware instance for each router that
references it (a rate limit or in-flight budget stays per router, proven on the real Traefik
in tests/integration/test_shared_objects.py), and a transport's settings are its content.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..keys import SHARED_PREFIX
from .flatten import flatten

# 64 bits of SHA-256: distinct definitions under one root never meet in practice.
_HASH_CHARS = 16


@dataclass(frozen=True, slots=True)
class SharedObject:
    """One shared object under a root: its path (`<root>/http/<section>/<name>`) and its keys."""

    path: str
    kv: Mapping[str, str]

    @property
    def witness(self) -> str:
        """The key a transaction compares to know the object exists (its first key)."""
        return min(self.kv)


def shared_name(kind: str, definition: Mapping[str, Any]) -> str:
    """The name of a shared object of `kind` (`allow`, `rate`, `transport`, ...) defined as `definition`."""
    text = json.dumps(definition, sort_keys=True, separators=(",", ":"))
    return f"{SHARED_PREFIX}{kind}-{hashlib.sha256(text.encode()).hexdigest()[:_HASH_CHARS]}"


class SharedObjects:
    """Every shared object rendered so far, by path: one instance per definition, whichever ingress asked.

    Content never changes under a name, so this is also what a shared object seen in etcd must
    hold (`get`), for repairing one edited or deleted by someone else.
    """

    def __init__(self) -> None:
        self._objects: dict[str, SharedObject] = {}

    def object(self, root: str, section: str, kind: str, definition: dict[str, Any]) -> SharedObject:
        """The shared object of `definition` under `root` (made once, then the same instance)."""
        name = shared_name(kind, definition)
        path = f"{root}/http/{section}/{name}"
        found = self._objects.get(path)
        if found is None:
            kv = flatten({"http": {section: {name: definition}}}, root)
            found = self._objects[path] = SharedObject(path, kv)
        return found

    def get(self, path: str) -> SharedObject | None:
        """The shared object at `path`, when some render made it."""
        return self._objects.get(path)

    def forget(self, path: str) -> None:
        """The object was deleted (nothing references it): stop keeping its content."""
        self._objects.pop(path, None)
