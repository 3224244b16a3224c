"""A mirror of the keys etcd holds under the managed roots and the records prefix, at one revision.

Written only by the mirror (reconcile/mirror.py): a listing at a revision, then each later
revision whole and in order, so at every moment it is etcd as it was at `revision`. Indexed
by owning ingress so that planning one ingress touches only its own keys. Shared objects
(render/shared.py) are indexed by path, with how many keys reference each: one no key
references is an orphan, deleted by the next plan of its root.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Collection, Iterable, Iterator
from typing import cast

from ..keys import BEACON_KEY, IngressRef, KeyLayout
from .beacons import Beacons
from .shared import SharedIndex


class Observed:
    """Keys under the roots and the records prefix, as last seen: each with its value and mod_revision."""

    def __init__(self, layout: KeyLayout) -> None:
        self.layout = layout
        # Two dicts, not one of (value, mod_revision) tuples: 5 MB less at 10,000 ingresses of
        # 22 keys each. Revisions are shared ints (one per transaction, deduplicated when listed).
        self._values: dict[str, str] = {}
        self._mods: dict[str, int] = {}
        # (label, id) -> the keys of the objects named for that ingress, each object's keys
        # together. One list per ingress, not one per object with its path as a string: 14 MB
        # less at 10,000 ingresses of 7 objects each; an object's path is derived when asked.
        self._owned: dict[tuple[str, str], list[str]] = {}
        # Keys under the roots in no object named for an ingress (the root's own, anything foreign).
        self._loose: set[str] = set()
        # Shared objects: their keys, what references each, the orphans.
        self.sharing = SharedIndex(layout)
        self.beacons = Beacons()
        # The etcd revision the mirror is a copy of (0: not listed yet).
        self.revision = 0
        # The digest last computed, and the revision it is of: monitoring asks again and again.
        self._digest = (-1, "")

    def set(self, key: str, value: str | None, mod_revision: int) -> None:
        """Record a put (value) or delete (None) seen at `mod_revision`."""
        old = self._values.get(key)
        if old is not None and old != value:
            self.sharing.referenced(key, old, -1)
        if value is not None:
            self._values[key] = value
            self._mods[key] = mod_revision
            if old != value:
                self.sharing.referenced(key, value, 1)
            if key.endswith(BEACON_KEY) and (root := self.layout.beacon_root(key)) is not None:
                self.beacons.written(root, value, mod_revision)
            if old is None:
                self._index(key)
            return
        if old is None:
            return
        del self._values[key]
        del self._mods[key]
        obj, owner = self._owner_of(key)
        if obj is not None and obj in self.sharing.keys:
            self.sharing.removed(obj, key)
            return
        owned = self._owned.get(owner) if owner is not None else None
        if owner is None or owned is None:
            self._loose.discard(key)
            return
        if key in owned:
            owned.remove(key)
        if not owned:
            del self._owned[owner]

    def _owner_of(self, key: str) -> tuple[str | None, tuple[str, str] | None]:
        """The object path of a key under a root, and the (label, id) that object is named for."""
        obj = self.layout.object_of(key)
        return obj, self.layout.object_key_of(obj) if obj is not None else None

    def _index(self, key: str) -> None:
        obj, owner = self._owner_of(key)
        if obj is not None and owner is None and self.layout.is_shared(obj):
            self.sharing.added(obj, key)
            return
        if obj is None or owner is None:
            if key.startswith(self.layout.roots_prefix):
                self._loose.add(key)
            return
        keys = self._owned.get(owner)
        if keys is None:
            # The label is every ingress's of its authority: one string for all of them, not one parsed per ingress.
            self._owned[(sys.intern(owner[0]), owner[1])] = [key]
            return
        lead = obj + "/"
        for at in range(len(keys) - 1, -1, -1):
            if keys[at].startswith(lead):
                keys.insert(at + 1, key)  # beside the other keys of its object
                return
        keys.append(key)

    def _keys_of(self, ref: IngressRef) -> Iterator[str]:
        """The observed keys of the objects under the ingress's root named for it, each object's together."""
        prefix = self.layout.root(ref.authority) + "/"
        return (k for k in self._owned.get(self.layout.object_key(ref), ()) if k.startswith(prefix))

    def load(self, kvs: Iterable[tuple[str, str, int]], revision: int) -> None:
        """Replace everything with a full read taken at `revision`."""
        self._values.clear()
        self._mods.clear()
        self._owned.clear()
        self._loose.clear()
        self.sharing.clear()
        revisions: dict[int, int] = {}
        for key, value, mod in kvs:
            self.set(key, value, revisions.setdefault(mod, mod))
        self.revision = revision

    def get(self, key: str) -> tuple[str, int] | None:
        """The observed value and mod_revision of one key (None: not there)."""
        value = self._values.get(key)
        return None if value is None else (value, self._mods[key])

    def objects_of(self, ref: IngressRef) -> dict[str, dict[str, tuple[str, int]]]:
        """The observed objects under the ingress's root named for it, with their keys."""
        out: dict[str, dict[str, tuple[str, int]]] = {}
        lead = "\0"  # no key starts with it
        keys: dict[str, tuple[str, int]] = {}
        values, mods = self._values, self._mods
        for key in self._keys_of(ref):
            if not key.startswith(lead):  # the first key of the next object
                obj = cast(str, self.layout.object_of(key))  # an indexed key is in an object
                lead, keys = obj + "/", out.setdefault(obj, {})
            keys[key] = (values[key], mods[key])
        return out

    def newest_mod(self, ref: IngressRef) -> int:
        """The newest mod_revision among the ingress's observed keys (0: none), without copying them."""
        return max(map(self._mods.__getitem__, self._keys_of(ref)), default=0)

    def stamp(self, ref: IngressRef) -> tuple[int, ...]:
        """The mod_revisions of the ingress's observed keys, in the index's order: equal stamps mean
        none of its keys changed, came or went in between (a changed key has a newer revision,
        one deleted and put again too, and every key of one revision is mirrored at once)."""
        return tuple(map(self._mods.__getitem__, self._keys_of(ref)))

    def server_urls(self, ref: IngressRef) -> frozenset[str]:
        """The server URLs the ingress's load balancers hold in etcd right now."""
        return frozenset(value for keys in self.objects_of(ref).values() for key, (value, _mod) in keys.items() if key.endswith("/url"))

    def record(self, key: str) -> tuple[str, int] | None:
        """The observed value and mod_revision of a record key."""
        return self.get(key)

    def records(self) -> dict[str, tuple[str, int]]:
        """Every observed record key."""
        prefix = self.layout.records_dir
        return {k: (v, self._mods[k]) for k, v in self._values.items() if k.startswith(prefix)}

    def foreign(self, root: str, owned: Collection[tuple[str, str]]) -> list[str]:
        """The keys under `root` that are neither its own nor in an object named for one of `owned`
        ((label, id) pairs), from the index: a full pass asks for them at every root."""
        prefix, layout = root + "/", self.layout
        out = [k for k in self._loose if k.startswith(prefix) and not layout.is_root_owned(root, k)]
        for owner, keys in self._owned.items():
            if owner not in owned:
                out.extend(k for k in keys if k.startswith(prefix))
        return out

    def shared(self, object_path: str) -> dict[str, tuple[str, int]]:
        """The observed keys of one shared object (empty: it is not there)."""
        return {k: (self._values[k], self._mods[k]) for k in self.sharing.keys.get(object_path, ())}

    def under_root(self, root: str) -> dict[str, tuple[str, int]]:
        """Every observed key under one root (a full scan; used by full reconciles and reports)."""
        prefix = root + "/"
        return {k: (v, self._mods[k]) for k, v in self._values.items() if k.startswith(prefix)}

    def __len__(self) -> int:
        return len(self._values)

    def digest(self) -> str:
        """The lowercase hex SHA-256 of every key, in ascending byte order: key, 0x00, value, 0x00, mod_revision
        in ASCII decimal, 0x0A (what a range read of etcd at `revision` hashes to as well)."""
        if self._digest[0] == self.revision:
            return self._digest[1]  # the mirror changes only with its revision
        sha = hashlib.sha256()
        values, mods = self._values, self._mods
        # str order is code point order, which is UTF-8 byte order.
        for key in sorted(values):
            sha.update(b"%s\0%s\0%d\n" % (key.encode(), values[key].encode(), mods[key]))
        self._digest = (self.revision, sha.hexdigest())
        return self._digest[1]
