"""Write: apply a Plan to etcd as ordered, compare-guarded transactions."""
