"""Several requests in one write (Client.request_many / txn.pipelined): the broker
answers them in order and each sees what the ones before it did, which is what the
sink's one-write steps rest on (join + offsets, EndTxn + look, Produce + re-check)."""
from __future__ import annotations

import uuid

import pytest

from semel.client import txn as wire
from semel.client.client import Client
from semel.protocol.errors import KafkaError
from tests.support.brokers import module_broker_fixture

broker = module_broker_fixture("pipelined")


@pytest.fixture
def client(broker):
    with Client(broker.bootstrap) as c:
        yield c


def test_a_transaction_in_two_writes_commits_offsets_and_records(client):
    topic, group, tid = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}", f"x-{uuid.uuid4().hex[:8]}"
    assert client.create_topic(topic, 2) == KafkaError.NONE
    err, st = wire.init_producer_id(client, tid, 60000)
    assert err == KafkaError.NONE
    rows = [(b"k", b"v%d" % i, []) for i in range(5)]
    data = {(topic, p): wire.build_txn_batch(rows, st.pid, st.epoch, 0) for p in (0, 1)}
    # join, produce to both partitions in one request, add the group and commit its offsets
    added, produced, offsets_added, committed = wire.pipelined(
        client, (wire.add_partitions_call(client, st, list(data)), wire.add_partitions_result),
        (wire.produce_call(st, data), wire.produce_result),
        (wire.add_offsets_call(st, group), wire.error_result),
        (wire.txn_offset_commit_call(client, st, group, {(topic, 0): 3}, "m"), wire.txn_offset_commit_result))
    assert set(added.values()) == {KafkaError.NONE}
    assert produced == {(topic, 0): KafkaError.NONE, (topic, 1): KafkaError.NONE}
    assert offsets_added == KafkaError.NONE and committed == {(topic, 0): KafkaError.NONE}
    # the decision and a read behind it in one write: the read sees the committed offset
    ended, got = wire.pipelined(client, (wire.end_txn_call(tid, st.pid, st.epoch, True), wire.error_result),
                                (wire.committed_call(group, [(topic, 0)]), wire.committed_result(group)))
    assert ended == KafkaError.NONE
    assert got == {(topic, 0): (3, "m")}
    for p in (0, 1):
        assert client.list_offset(topic, p, -1, isolation=1) == 6  # 5 records + the commit marker


def test_a_produce_behind_a_refused_join_is_refused_too(client):
    topic, tid = f"t-{uuid.uuid4().hex[:8]}", f"x-{uuid.uuid4().hex[:8]}"
    assert client.create_topic(topic, 1) == KafkaError.NONE
    err, st = wire.init_producer_id(client, tid, 60000)
    assert err == KafkaError.NONE
    stale = wire.TxnState(tid, st.pid, st.epoch - 1 if st.epoch else st.epoch + 5)
    data = {(topic, 0): wire.build_txn_batch([(None, b"v", [])], stale.pid, stale.epoch, 0)}
    added, produced = wire.pipelined(client, (wire.add_partitions_call(client, stale, list(data)),
                                              wire.add_partitions_result),
                                     (wire.produce_call(stale, data), wire.produce_result))
    assert added[(topic, 0)] != KafkaError.NONE
    assert produced[(topic, 0)] != KafkaError.NONE
    assert client.list_offset(topic, 0, -1) == 0
