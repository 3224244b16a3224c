"""A mirror of the keys observed in etcd under the managed roots and the records prefix.

Fed by paged range reads, by the writer's own committed transactions and by the watch;
indexed by owning ingress so that planning one ingress touches only its own keys.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from ..etcd.client import KeyValue
from .ownership import owner_of_object

_KINDS = frozenset({"http", "tcp", "udp"})


class Observed:
    """Keys under `roots_prefix` and `records_prefix`, as last seen: key -> (value, mod_revision)."""

    def __init__(self, root_key: str, records_prefix: str) -> None:
        # Every root has as many segments as the root_key template.
        self.roots_prefix = root_key.split("{authority}")[0] if "{authority}" in root_key else root_key + "/"
        self._root_depth = root_key.count("/") + 1
        self.records_prefix = records_prefix.rstrip("/") + "/"
        self.keys: dict[str, tuple[str, int]] = {}
        # object path -> keys under it
        self._objects: dict[str, set[str]] = defaultdict(set)
        # (authority, id) -> object paths named for it
        self._owners: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.revision = 0

    def _object_of(self, key: str) -> str | None:
        if not key.startswith(self.roots_prefix):
            return None
        depth = self._root_depth
        parts = key.split("/", depth + 3)
        if len(parts) < depth + 4 or parts[depth] not in _KINDS or not parts[depth + 2]:
            return None
        return "/".join(parts[: depth + 3])

    def set(self, key: str, value: str | None, mod_revision: int) -> None:
        """Record a put (value) or delete (None) seen at `mod_revision`."""
        if value is not None:
            known = key in self.keys
            self.keys[key] = (value, mod_revision)
            if known:
                return  # already indexed
            obj = self._object_of(key)
            if obj is not None:
                self._objects[obj].add(key)
                owner = owner_of_object(obj)
                if owner is not None:
                    self._owners[owner].add(obj)
            return
        if self.keys.pop(key, None) is None:
            return
        obj = self._object_of(key)
        members = self._objects.get(obj) if obj is not None else None
        if members is None or obj is None:
            return
        members.discard(key)
        if not members:
            del self._objects[obj]
            owner = owner_of_object(obj)
            if owner is not None:
                self._owners[owner].discard(obj)
                if not self._owners[owner]:
                    del self._owners[owner]

    def load(self, kvs: Iterable[tuple[str, str, int]], revision: int) -> None:
        """Replace everything with a full read taken at `revision`."""
        self.keys.clear()
        self._objects.clear()
        self._owners.clear()
        for key, value, mod in kvs:
            self.set(key, value, mod)
        self.revision = revision

    def replace_object(self, object_path: str, kvs: Iterable[KeyValue]) -> None:
        """Replace what is known under one object with a fresh read."""
        for key in list(self._objects.get(object_path, ())):
            self.set(key, None, 0)
        for kv in kvs:
            self.set(kv.key, kv.value, kv.mod_revision)

    def owner_of_key(self, key: str) -> tuple[str, str] | None:
        """The (authority, id) an object key under a root is named for."""
        obj = self._object_of(key)
        return owner_of_object(obj) if obj else None

    def objects_of(self, owner: tuple[str, str], root: str) -> dict[str, dict[str, tuple[str, int]]]:
        """The observed objects under `root` named for `owner`, with their keys."""
        out: dict[str, dict[str, tuple[str, int]]] = {}
        for obj in self._owners.get(owner, ()):
            if obj.startswith(root + "/"):
                out[obj] = {k: self.keys[k] for k in self._objects[obj]}
        return out

    def record(self, key: str) -> tuple[str, int] | None:
        """The observed value and mod_revision of a record key."""
        return self.keys.get(key)

    def records(self) -> dict[str, tuple[str, int]]:
        """Every observed record key."""
        return {k: v for k, v in self.keys.items() if k.startswith(self.records_prefix)}

    def under_root(self, root: str) -> dict[str, tuple[str, int]]:
        """Every observed key under one root (a full scan; used by full reconciles and reports)."""
        prefix = root + "/"
        return {k: v for k, v in self.keys.items() if k.startswith(prefix)}
