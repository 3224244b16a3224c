"""Where everything lives in etcd, derived in one place: `KeyLayout`, and an ingress's identity, `IngressRef`.

Under each root (one per authority, from the `root_key` template, the authority verbatim)
the exporter owns the root keys below and every object named for one of its ingresses:
`<label>_<id>` or `<label>_<id>_<suffix>`, where the label is the authority itself when it is
a lowercase DNS label, and otherwise a safe label derived from it (`<sanitized>--<hash>`).
Neither label nor id may contain `_`, so an object name alone says which ingress it belongs to.
Objects several ingresses define identically (edge middlewares, servers transports) are shared:
one object per root named from its content, `shared-<kind>-<hash>` (no `_`: it names no
ingress), owned by the root while a router or service references it.
Beside the roots: the records (`<records>/<authority>/<id>`), the published health documents
(`<health>/<authority>/<id>`), the probing shards (`<health>.shards/<identity>` and their
observations `<health>.shards/<identity>/<authority>/<id>`) and the election key.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

# Keys the exporter keeps under every root (see render/root_keys.py for why).
OWNER_KEY = "_meta/owner"
CERT_KEY = "tls/stores/default/defaultCertificate/certFile"
KEY_KEY = "tls/stores/default/defaultCertificate/keyFile"
# The beacon: a middleware no router uses, rewritten by every exporter transaction under the
# root; reading its value back through Traefik's API tells which commit Traefik has applied.
BEACON_NAME = "exporter-beacon"
BEACON_HEADER = "X-Exporter-Beacon"
BEACON_KEY = f"http/middlewares/{BEACON_NAME}/headers/customRequestHeaders/{BEACON_HEADER}"
ROOT_OWNED = frozenset({OWNER_KEY, CERT_KEY, KEY_KEY, BEACON_KEY})
# Traefik's configuration kinds: the first segment of an object path under a root.
_KINDS = frozenset({"http", "tcp", "udp"})
# Shared objects: their name's prefix, and the sections they are in with what references them.
SHARED_PREFIX = "shared-"
SHARED_SECTIONS = {"middlewares": "routers", "serversTransports": "services"}
# An authority used verbatim in object names: a lowercase DNS label, not all digits.
_VERBATIM_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
_HASH_CHARS = 16
# Authorities whose object label is kept (a label is recomputed, identically, past this many).
_LABELS_KEPT = 65_536


def derived_label(authority: str) -> str:
    """The object label of an authority that is not a lowercase DNS label: readable, and distinct per authority.

    `<sanitized authority, at most 40 chars>--<first 16 hex of its SHA-256>`: `Worker_1` ->
    `worker-1--<hash>`. The hash keeps two authorities that sanitize alike (`worker_1`,
    `Worker-1`) apart.
    """
    sanitized = re.sub(r"[^a-z0-9]+", "-", authority.lower()).strip("-")[:40].strip("-") or "a"
    return f"{sanitized}--{hashlib.sha256(authority.encode()).hexdigest()[:_HASH_CHARS]}"


def _looks_derived(label: str) -> bool:
    return label[-_HASH_CHARS - 2 : -_HASH_CHARS] == "--"


class IngressRef(NamedTuple):
    """The identity of an ingress: (authority, id)."""

    authority: str
    id: str

    def __str__(self) -> str:
        return f"{self.authority}/{self.id}"


def _child(prefix: str, key: str) -> IngressRef | None:
    """The ref of `<prefix>/<authority>/<id>`, or None for anything else."""
    if not key.startswith(prefix):
        return None
    authority, _, ingress_id = key[len(prefix) :].partition("/")
    if not authority or not ingress_id or "/" in ingress_id:
        return None
    return IngressRef(authority, ingress_id)


def overlapping_roots(roots: Iterable[str]) -> list[tuple[str, str]]:
    """Every pair (a, b) of roots where a is a string prefix of b (`traefik/worker_1`, `traefik/worker_10`).

    Traefik watches its rootKey as a plain string prefix: every write under b wakes a's Traefik
    for a full rebuild (docs/operations.md, "Roots that are prefixes of each other").
    """
    pairs: list[tuple[str, str]] = []
    enclosing: list[str] = []  # in sorted order, the roots that are prefixes of the current one
    for root in sorted(set(roots)):
        while enclosing and not root.startswith(enclosing[-1]):
            enclosing.pop()
        pairs.extend((outer, root) for outer in enclosing)
        enclosing.append(root)
    return pairs


class Labels:
    """The label that stands for each authority in object names, and the authorities met so far.

    A DNS-label authority is its own label; any other gets a derived one (`derived_label`),
    which names no authority by itself: an object name is resolved back through the derived
    labels of the authorities this table has labelled (every record the exporter holds is
    labelled when it is planned or mirrored). The state is this table's alone; the layout
    owns one.
    """

    def __init__(self) -> None:
        # Derived labels met so far -> their authority.
        self._derived: dict[str, str] = {}
        # Authority -> its label: asked for several times per ingress planned, from few authorities.
        self._known: dict[str, str] = {}

    def label(self, authority: str) -> str:
        """The label of `authority` (a derived one is remembered, so names made from it resolve back)."""
        label = self._known.get(authority)
        if label is not None:
            return label
        label = authority if _VERBATIM_RE.match(authority) and not authority.isdigit() else derived_label(authority)
        if _looks_derived(label):
            self._derived[label] = authority
        if len(self._known) < _LABELS_KEPT:
            self._known[authority] = label
        return label

    def authority(self, label: str) -> str | None:
        """The authority `label` stands for; None for a derived label of an authority not labelled here."""
        authority = self._derived.get(label)
        if authority is not None:
            return authority
        return None if _looks_derived(label) or not _VERBATIM_RE.match(label) else label


@dataclass(frozen=True)
class KeyLayout:
    """Every key name the exporter reads or writes, built once from the settings."""

    root_key: str = "traefik/worker_{authority}"
    records_prefix: str = "traefik-etcd-exporter/records"
    health_prefix: str = ""
    election_key: str = ""
    # Derived: the common prefix of every root (what the mirror lists and watches).
    roots_prefix: str = field(init=False)
    _root_depth: int = field(init=False)
    # The labels of the authorities met, through which object names resolve back (one per layout).
    labels: Labels = field(init=False, default_factory=Labels, compare=False, repr=False)

    def __post_init__(self) -> None:
        records = self.records_prefix.rstrip("/")
        object.__setattr__(self, "records_prefix", records)
        object.__setattr__(self, "health_prefix", self.health_prefix.rstrip("/") or f"{records}.health")
        object.__setattr__(self, "election_key", self.election_key or f"{records}.leader")
        prefix = self.root_key.split("{authority}")[0] if "{authority}" in self.root_key else self.root_key + "/"
        object.__setattr__(self, "roots_prefix", prefix)
        # Every root has as many segments as the root_key template.
        object.__setattr__(self, "_root_depth", self.root_key.count("/") + 1)

    # ----- roots and the objects under them

    def root(self, authority: str) -> str:
        """The Traefik rootKey of one authority."""
        return self.root_key.replace("{authority}", authority)

    def beacon_key(self, root: str) -> str:
        """The beacon of `root`."""
        return f"{root}/{BEACON_KEY}"

    def beacon_root(self, key: str) -> str | None:
        """The root whose beacon `key` is, or None."""
        if not key.endswith(BEACON_KEY) or not key.startswith(self.roots_prefix):
            return None
        root = key[: -len(BEACON_KEY) - 1]
        return root if root.count("/") == self._root_depth - 1 else None

    def is_root_owned(self, root: str, key: str) -> bool:
        """True for the sentinel and default-certificate keys of `root`."""
        return key.startswith(root + "/") and key[len(root) + 1 :] in ROOT_OWNED

    def object_label(self, authority: str) -> str:
        """The label that stands for `authority` in object names (the authority itself when it is a DNS label)."""
        return self.labels.label(authority)

    def object_key(self, ref: IngressRef) -> tuple[str, str]:
        """(label, id): how an ingress's objects are indexed by name."""
        return self.object_label(ref.authority), ref.id

    def object_name(self, ref: IngressRef) -> str:
        """The base Traefik object name of an ingress (its other objects add `_<suffix>`)."""
        return f"{self.object_label(ref.authority)}_{ref.id}"

    @staticmethod
    def object_key_of(object_path: str) -> tuple[str, str] | None:
        """(label, id) an object path (`.../http/routers/<name>`) is named for, by the naming rule."""
        name = object_path.rsplit("/", 1)[-1]
        parts = name.split("_", 2)
        if len(parts) < 2 or not parts[0] or not parts[1]:
            return None
        return parts[0], parts[1]

    @staticmethod
    def is_shared(object_path: str) -> bool:
        """True for the path of a shared object (`<root>/http/middlewares/shared-...`)."""
        head, _, name = object_path.rpartition("/")
        return name.startswith(SHARED_PREFIX) and head.rpartition("/")[2] in SHARED_SECTIONS and "_" not in name

    def shared_reference(self, key: str, value: str) -> str | None:
        """The shared object a key names, when it is a reference to one: a router's middleware
        (`.../http/routers/<r>/middlewares/<i>`) or a service's `serversTransport`."""
        if not value.startswith(SHARED_PREFIX):
            return None
        obj = self.object_of(key)
        if obj is None:
            return None
        head, _, section = obj.rpartition("/")[0].rpartition("/")
        rest = key[len(obj) + 1 :]
        if section == "routers" and rest.startswith("middlewares/"):
            return f"{head}/middlewares/{value}"
        if section == "services" and rest.endswith("serversTransport"):
            return f"{head}/serversTransports/{value}"
        return None

    def owner_of_object(self, object_path: str) -> IngressRef | None:
        """The ingress an object path is named for; None when its label stands for no authority met so far."""
        named = self.object_key_of(object_path)
        if named is None:
            return None
        label, ingress_id = named
        authority = self.labels.authority(label)
        return IngressRef(authority, ingress_id) if authority is not None else None

    def object_of(self, key: str) -> str | None:
        """The object path (`<root>/<kind>/<section>/<name>`) a key under a root belongs to."""
        if not key.startswith(self.roots_prefix):
            return None
        depth = self._root_depth
        parts = key.split("/", depth + 3)
        if len(parts) < depth + 4 or parts[depth] not in _KINDS or not parts[depth + 2]:
            return None
        return "/".join(parts[: depth + 3])

    def owner_of_key(self, key: str) -> IngressRef | None:
        """The ingress an object key under a root is named for."""
        obj = self.object_of(key)
        return self.owner_of_object(obj) if obj else None

    # ----- records, health documents

    @property
    def records_dir(self) -> str:
        """The prefix every record key starts with."""
        return self.records_prefix + "/"

    def record_key(self, ref: IngressRef) -> str:
        """Where the record of one ingress lives."""
        return f"{self.records_prefix}/{ref.authority}/{ref.id}"

    def record_ref(self, key: str) -> IngressRef | None:
        """The ingress of a record key, or None for anything else."""
        return _child(self.records_dir, key)

    @property
    def health_dir(self) -> str:
        """The prefix every published health document starts with."""
        return self.health_prefix + "/"

    def health_key(self, ref: IngressRef) -> str:
        """Where the leader publishes one ingress's node states."""
        return f"{self.health_prefix}/{ref.authority}/{ref.id}"

    def health_ref(self, key: str) -> IngressRef | None:
        """The ingress of a health document key, or None."""
        return _child(self.health_dir, key)

    @property
    def shards_dir(self) -> str:
        """The prefix of the probing shards: each sidecar's announcement, and its observations below it."""
        return self.health_prefix + ".shards/"

    def shard_key(self, identity: str) -> str:
        """Where a sidecar announces itself as a prober (a key on its own lease)."""
        return self.shards_dir + identity

    def observation_key(self, identity: str, ref: IngressRef) -> str:
        """Where a sidecar publishes the node states it probed for one ingress."""
        return f"{self.shards_dir}{identity}/{ref.authority}/{ref.id}"

    def shard_of(self, key: str) -> tuple[str, IngressRef | None] | None:
        """(identity, None) for an announcement, (identity, ingress) for an observation, None for anything else."""
        if not key.startswith(self.shards_dir):
            return None
        identity, sep, rest = key[len(self.shards_dir) :].partition("/")
        if not identity:
            return None
        if not sep:
            return identity, None
        ref = _child("", rest)
        return (identity, ref) if ref is not None else None
