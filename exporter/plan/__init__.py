"""Plan: the diff between desired keys and the owned keys observed in etcd, as a value."""
