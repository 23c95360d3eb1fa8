"""A refused request is answered in its API's own response shape, with the error where
that response carries errors: the answer encodes at every version the broker serves and
decodes to the refusal's code."""
import pytest

from semel.broker import handlers  # noqa: F401  (registers every handler)
from semel.broker.coordinator_gate import GATED
from semel.broker.refusal import refuse
from semel.broker.router import RequestContext, supported_versions
from semel.broker.session import Connection
from semel.protocol.api_keys import ApiKey
from semel.protocol.errors import KafkaError
from semel.protocol.messages import decode_response, encode_response, request_class

CODE = KafkaError.NOT_COORDINATOR


def _known(cls, version: int, **fields):
    """cls at `version` with those of `fields` it has."""
    names = {f.name for f in cls._struct._fields}
    return cls(version=version, **{k: v for k, v in fields.items() if k in names})


def _request(api: int, version: int):
    R = request_class(api)
    if api in (ApiKey.OFFSET_COMMIT, ApiKey.TXN_OFFSET_COMMIT):
        T = R.OffsetCommitRequestTopic if api == ApiKey.OFFSET_COMMIT else R.TxnOffsetCommitRequestTopic
        P = T.OffsetCommitRequestPartition if api == ApiKey.OFFSET_COMMIT else T.TxnOffsetCommitRequestPartition
        return _known(R, version, group_id="g", transactional_id="t", topics=[
            T(name="a", partitions=[P(partition_index=0), P(partition_index=1)])])
    if api == ApiKey.OFFSET_FETCH and version >= 8:
        G = R.OffsetFetchRequestGroup
        return R(version=version, groups=[G(group_id="g", topics=None), G(group_id="h", topics=None)])
    if api == ApiKey.OFFSET_FETCH:
        return R(version=version, group_id="g", topics=[R.OffsetFetchRequestTopic(name="a", partition_indexes=[0, 1])])
    if api == ApiKey.ADD_PARTITIONS_TO_TXN:
        T = R.AddPartitionsToTxnTopic
        return R(version=version, v3_and_below_transactional_id="t",
                 v3_and_below_topics=[T(name="a", partitions=[0, 1])])
    return _known(R, version, group_id="g", transactional_id="t", member_id="m")


def _errors(resp) -> set[int]:
    """The error codes of the decoded response's partitions, or its top-level one
    when it lists none."""
    found = {g.error_code for g in getattr(resp, "groups", None) or ()}
    for t in getattr(resp, "topics", None) or getattr(resp, "results_by_topic_v3_and_below", None) or ():
        for p in getattr(t, "partitions", None) or getattr(t, "results_by_partition", None) or ():
            found.add(p.error_code if hasattr(p, "error_code") else p.partition_error_code)
    return found or {resp.error_code}


@pytest.mark.parametrize("api", sorted(GATED), ids=lambda a: ApiKey(a).name)
def test_a_coordinator_refusal_encodes_at_every_version_with_its_code(api):
    lo, hi = supported_versions()[api]
    for version in range(lo, hi + 1):
        ctx = RequestContext(None, api, version, 7, "c", "peer", Connection("peer", "?", None, None))
        frame = encode_response(api, version, 7, refuse(ctx, _request(api, version), CODE))
        corr, resp = decode_response(api, version, frame[4:])
        assert corr == 7 and _errors(resp) == {CODE}, (ApiKey(api).name, version)
