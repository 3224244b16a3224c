"""The shared objects seen under the roots (render/shared.py): their keys, the keys that
reference each, and the orphans, those present that nothing references.

A reference is a router's middleware or a service's `serversTransport` naming one; it is
counted whether or not the object is there, so an object that appears after its referrer
(a write in flight, a repair) is never taken for an orphan.
"""

from __future__ import annotations

from ..keys import KeyLayout


class SharedIndex:
    """Keys, reference counts and orphans of the shared objects, by object path."""

    def __init__(self, layout: KeyLayout) -> None:
        self._layout = layout
        self.keys: dict[str, list[str]] = {}
        self._refs: dict[str, int] = {}
        self._orphans: set[str] = set()

    def clear(self) -> None:
        """Forget everything (a full read follows)."""
        self.keys.clear()
        self._refs.clear()
        self._orphans.clear()

    def referenced(self, key: str, value: str, delta: int) -> None:
        """Count `key` (holding `value`) as a reference (+1), or stop counting it (-1), when it names a shared object."""
        obj = self._layout.shared_reference(key, value)
        if obj is None:
            return
        count = self._refs.get(obj, 0) + delta
        if count:
            self._refs[obj] = count
            self._orphans.discard(obj)
        else:
            self._refs.pop(obj, None)
            if obj in self.keys:
                self._orphans.add(obj)

    def added(self, obj: str, key: str) -> None:
        """A key of shared object `obj` appeared."""
        keys = self.keys.get(obj)
        if keys is not None:
            keys.append(key)
            return
        self.keys[obj] = [key]
        if obj not in self._refs:
            self._orphans.add(obj)

    def removed(self, obj: str, key: str) -> None:
        """A key of shared object `obj` went."""
        keys = self.keys[obj]
        keys.remove(key)
        if not keys:
            del self.keys[obj]
            self._orphans.discard(obj)

    def references(self, obj: str) -> int:
        """How many observed keys reference `obj`."""
        return self._refs.get(obj, 0)

    def referenced_under(self, root: str) -> list[str]:
        """The shared objects under `root` that some observed key references."""
        prefix = root + "/"
        return sorted(obj for obj in self._refs if obj.startswith(prefix))

    def orphans(self, root: str | None = None) -> list[str]:
        """The shared objects present (under `root`, or any) that no observed key references."""
        return sorted(obj for obj in self._orphans if root is None or obj.startswith(root + "/"))
