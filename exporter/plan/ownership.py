"""Which keys under a root belong to which ingress (pure; no I/O).

Every object an ingress renders is named `<authority>_<id>` or `<authority>_<id>_<suffix>`
(the renderer enforces it). Neither label may contain `_`, so an object name alone says
which ingress it belongs to; it is owned when that ingress has a record. Everything else
under a root, except the exporter's root keys, is foreign: reported, never touched.
"""

from __future__ import annotations

from ..render.root_keys import CERT_KEY, KEY_KEY, OWNER_KEY

ROOT_OWNED = frozenset({OWNER_KEY, CERT_KEY, KEY_KEY})


def owner_of_object(object_path: str) -> tuple[str, str] | None:
    """(authority, id) named by an object path, by the naming rule above."""
    name = object_path.rsplit("/", 1)[1]
    parts = name.split("_", 2)
    if len(parts) < 2 or not parts[0] or not parts[1]:
        return None
    return parts[0], parts[1]


def is_root_owned(root: str, key: str) -> bool:
    """True for the sentinel and default-certificate keys of `root`."""
    return key.startswith(root + "/") and key[len(root) + 1 :] in ROOT_OWNED
