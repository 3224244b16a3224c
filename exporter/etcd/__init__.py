"""The etcd store: a thin client of etcd's v3 JSON gateway (range, txn, watch)."""

from .client import Compare, EtcdClient, EtcdError, KeyValue, Op, TxnResult

__all__ = ["Compare", "EtcdClient", "EtcdError", "KeyValue", "Op", "TxnResult"]
