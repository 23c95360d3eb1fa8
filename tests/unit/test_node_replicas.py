"""NodeReplicas, a single node's replicas as the handlers ask about them: a cluster of
one. Its answers are a one-broker cluster leader's: the same leadership and epoch
fencing as check_leader over a cluster view where this node leads every partition at
epoch 0, follower fetches refused, one epoch ending at the log end, an ISR of one."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semel.broker.local_replicas import NOTHING_LED, NodeReplicas
from semel.broker.node_view import LEADER_EPOCH
from semel.cluster.replica_rules import check_leader
from semel.cluster.state import MemoryClusterView, PartitionState
from semel.protocol.errors import KafkaError
from semel.protocol.records import build_batch, split_batches
from semel.storage import LogConfig, LogManager

NODE = 3
TOPICS = {"a": 2, "b": 1}
epochs = st.integers(min_value=-1, max_value=4)
partitions = st.sampled_from([("a", 0), ("a", 1), ("b", 0), ("a", 2), ("c", 0)])   # the last two unknown


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    m = LogManager(tmp_path_factory.mktemp("node-replicas"), LogConfig())
    for name, count in TOPICS.items():
        assert m.create_topic(name, count) == KafkaError.NONE
    plog = m.get("a", 0)
    assert plog is not None
    data = build_batch([(None, b"x"), (None, b"y")], timestamp_ms=1_000)
    batches, err = split_batches(data)
    assert err == 0
    plog.append(data, batches)
    yield m
    m.close()


@pytest.fixture(scope="module")
def one_broker_view():
    table = MemoryClusterView.table()
    view = MemoryClusterView(table, NODE)
    for name, count in TOPICS.items():
        table.create_topic(name, [(NODE,)] * count)     # led here at epoch 0
    return view


@settings(max_examples=60, deadline=None)
@given(tp=partitions, epoch=epochs)
def test_leadership_is_a_one_broker_cluster_leaders(logs, one_broker_view, tp, epoch):
    assert NodeReplicas(NODE, logs).leader_error(*tp, epoch) is check_leader(one_broker_view, *tp, epoch)


@settings(max_examples=60, deadline=None)
@given(tp=partitions, current=epochs, asked=epochs)
def test_offset_for_leader_epoch(logs, tp, current, asked):
    err, epoch, end = NodeReplicas(NODE, logs).epoch_end(*tp, current, asked)
    plog = logs.get(*tp)
    if plog is None:
        assert (err, epoch, end) == (KafkaError.UNKNOWN_TOPIC_OR_PARTITION, -1, -1)
    elif current > LEADER_EPOCH:      # the asker knows a newer leader than this one
        assert (err, epoch, end) == (KafkaError.UNKNOWN_LEADER_EPOCH, -1, -1)
    elif asked != LEADER_EPOCH:       # no such epoch in the log: undefined, no error
        assert (err, epoch, end) == (KafkaError.NONE, -1, -1)
    else:
        assert (err, epoch, end) == (KafkaError.NONE, LEADER_EPOCH, plog.log_end_offset)


def test_the_one_epoch_ends_at_the_log_end(logs):
    assert NodeReplicas(NODE, logs).epoch_end("a", 0, LEADER_EPOCH, LEADER_EPOCH) == (KafkaError.NONE, 0, 2)
    assert NodeReplicas(NODE, logs).epoch_end("a", 1, -1, LEADER_EPOCH) == (KafkaError.NONE, 0, 0)


@settings(max_examples=40, deadline=None)
@given(tp=partitions, epoch=epochs, replica=st.integers(min_value=0, max_value=5))
def test_no_broker_follows_a_single_node(logs, tp, epoch, replica):
    got = NodeReplicas(NODE, logs).replica_fetch(*tp, replica, 0, epoch)
    fenced = NodeReplicas(NODE, logs).leader_error(*tp, epoch)
    assert got is (fenced or KafkaError.NOT_LEADER_OR_FOLLOWER)


def test_appends_nothing_throttled_and_an_isr_of_one(logs):
    replicas = NodeReplicas(NODE, logs)
    assert replicas.before_append("a", 1, -1) is KafkaError.NONE
    assert replicas.before_append("a", 2, -1) is KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    assert replicas.throttle_allowance("a", 0, 1) == -1
    me = (NODE,)
    assert sorted(replicas.led(), key=lambda s: (s.topic, s.partition)) == [
        PartitionState("a", 0, me, NODE, 0, me), PartitionState("a", 1, me, NODE, 0, me),
        PartitionState("b", 0, me, NODE, 0, me)]
    assert NOTHING_LED.led() == []


def test_acks_all_needs_no_more_in_sync_replicas_than_the_one_node(tmp_path):
    """A topic asking for two in-sync replicas refuses acks=all on a single node, as a
    Kafka leader alone in its ISR does; acks 0 and 1 are taken; the broker's own default
    applies to a topic that sets none."""
    m = LogManager(tmp_path, LogConfig())
    try:
        assert m.create_topic("two", 1, {"min.insync.replicas": "2"}) == KafkaError.NONE
        assert m.create_topic("plain", 1) == KafkaError.NONE
        replicas = NodeReplicas(NODE, m)
        assert [replicas.before_append("two", 0, acks) for acks in (-1, 0, 1)] == [
            KafkaError.NOT_ENOUGH_REPLICAS, KafkaError.NONE, KafkaError.NONE]
        assert replicas.before_append("plain", 0, -1) is KafkaError.NONE
        assert NodeReplicas(NODE, m, min_insync_default=2).before_append("plain", 0, -1) is \
            KafkaError.NOT_ENOUGH_REPLICAS
    finally:
        m.close()
