"""A deterministic simulation of several reconcilers on the in-memory etcd (docs/simulation.md)."""
