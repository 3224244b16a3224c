"""Store: the desired ingress records, persisted in etcd beside the keys they render to."""
