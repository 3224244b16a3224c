"""The hand-written `TxnRequest` encoding is protobuf's own, byte for byte."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from exporter.etcd.proto import rpc_pb2
from exporter.etcd.types import Compare, Op, range_end
from exporter.etcd.wire import txn_request

keys = st.text(min_size=1, max_size=300)
revisions = st.integers(min_value=0, max_value=2**63 - 1)
compares = st.builds(
    Compare, keys, st.sampled_from(["EQUAL", "LESS", "GREATER", "NOT_EQUAL"]), revisions, st.booleans(),
    st.sampled_from(["MOD", "CREATE"]),
)
ops = st.builds(Op, keys, st.none() | st.text(max_size=3000), st.integers(min_value=0, max_value=2**63 - 1))


def _compare(c: Compare) -> rpc_pb2.Compare:
    """The compare as protobuf builds it: the reference."""
    result = getattr(rpc_pb2.Compare, c.result)
    end = range_end(c.key) if c.prefix else b""
    if c.target == "MOD":
        return rpc_pb2.Compare(key=c.key.encode(), range_end=end, target=rpc_pb2.Compare.MOD, result=result, mod_revision=c.mod_revision)
    return rpc_pb2.Compare(key=c.key.encode(), range_end=end, target=rpc_pb2.Compare.CREATE, result=result,
                           create_revision=c.mod_revision)


def _op(o: Op) -> rpc_pb2.RequestOp:
    if o.value is None:
        return rpc_pb2.RequestOp(request_delete_range=rpc_pb2.DeleteRangeRequest(key=o.key.encode()))
    return rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=o.key.encode(), value=o.value.encode(), lease=o.lease))


@given(st.lists(compares, max_size=20), st.lists(ops, max_size=40))
def test_the_encoding_is_protobufs(cs: list[Compare], os: list[Op]) -> None:
    expected = rpc_pb2.TxnRequest(compare=[_compare(c) for c in cs], success=[_op(o) for o in os]).SerializeToString()
    assert txn_request(cs, os) == expected


def test_a_create_compare_against_0_is_written_and_read_back() -> None:
    # The oneof carries presence: `create_revision == 0` ("the key does not exist") must be on the wire.
    parsed = rpc_pb2.TxnRequest.FromString(txn_request([Compare("k", "EQUAL", 0, target="CREATE")], []))
    assert parsed.compare[0].WhichOneof("target_union") == "create_revision" and parsed.compare[0].target == rpc_pb2.Compare.CREATE
