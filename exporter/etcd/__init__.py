"""etcd: the `EtcdStore` protocol the components use, its value types, and the client (gRPC or the JSON gateway)."""

from ..errors import EtcdError, WatchCanceled
from .client import EtcdClient
from .gateway import EtcdSecurity
from .store import EtcdStore
from .types import Compare, KeyValue, Op, RangePage, TxnResult, WatchEvent

__all__ = [
    "Compare", "EtcdClient", "EtcdError", "EtcdSecurity", "EtcdStore", "KeyValue", "Op", "RangePage", "TxnResult",
    "WatchCanceled", "WatchEvent",
]
