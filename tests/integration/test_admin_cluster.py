"""DescribeCluster (60) and OffsetForLeaderEpoch (23) against a real broker, and
ApiVersions advertising exactly the routed APIs."""
from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, KafkaError as CKError, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from semel.protocol.messages import request_class
from tests.support import wire
from tests.support.brokers import module_broker


@pytest.fixture(scope="module")
def mbroker(tmp_path_factory):
    with module_broker(tmp_path_factory, "admin-cluster") as b:
        yield b


def test_describe_cluster_confluent_and_kafka_python(mbroker):
    admin = AdminClient({"bootstrap.servers": mbroker.bootstrap})
    desc = admin.describe_cluster().result(30)
    host, port = mbroker.bootstrap.rsplit(":", 1)
    assert [(n.id, n.host, n.port) for n in desc.nodes] == [(0, host, int(port))]
    assert desc.controller.id == 0 and desc.cluster_id
    from kafka.admin import KafkaAdminClient
    kp = KafkaAdminClient(bootstrap_servers=mbroker.bootstrap)
    try:
        got = kp.describe_cluster()
    finally:
        kp.close()
    assert got["cluster_id"] == desc.cluster_id and got["controller_id"] == 0
    # Without an authorizer every operation of the resource type is authorized (KIP-430).
    assert sorted(got["authorized_operations"]) == CLUSTER_OPERATIONS
    assert desc.authorized_operations is None       # not asked for
    asked = admin.describe_cluster(include_authorized_operations=True).result(30)
    assert sorted(op.name for op in asked.authorized_operations) == CLUSTER_OPERATIONS
    admin.create_topics([NewTopic("ops-open", 1)])["ops-open"].result(30)
    (topic,) = admin.describe_topics(TopicCollection(["ops-open"]), include_authorized_operations=True).values()
    assert sorted(op.name for op in topic.result(30).authorized_operations) == TOPIC_OPERATIONS


CLUSTER_OPERATIONS = sorted(["ALTER", "ALTER_CONFIGS", "CLUSTER_ACTION", "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS",
                             "IDEMPOTENT_WRITE"])
TOPIC_OPERATIONS = sorted(["ALTER", "ALTER_CONFIGS", "CREATE", "DELETE", "DESCRIBE", "DESCRIBE_CONFIGS", "READ",
                           "WRITE"])


def test_describe_cluster_controllers_is_mismatched_endpoint(mbroker):
    sock = wire.connect(mbroker.bootstrap)
    try:
        resp = wire.call(sock, 60, 1, include_cluster_authorized_operations=False, endpoint_type=2)
    finally:
        sock.close()
    assert resp.error_code == 114 and resp.brokers == []


def _epoch_request(topic, partitions):
    R = request_class(23)
    T = R.OffsetForLeaderTopic
    return [T(topic=topic, partitions=[T.OffsetForLeaderPartition(
        partition=p, current_leader_epoch=cur, leader_epoch=ask) for p, cur, ask in partitions])]


def test_offset_for_leader_epoch(mbroker):
    name = "epoch-" + uuid.uuid4().hex[:8]
    admin = AdminClient({"bootstrap.servers": mbroker.bootstrap})  # must outlive its futures
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    p = Producer({"bootstrap.servers": mbroker.bootstrap})
    for i in range(7):
        p.produce(name, value=b"x", partition=0)
    assert p.flush(30) == 0
    asks = [(0, 0, 0), (0, -1, 0), (0, 1, 0), (0, 0, 3), (5, 0, 0)]
    sock = wire.connect(mbroker.bootstrap)
    try:
        resp = wire.call(sock, 23, 4, replica_id=-1, topics=_epoch_request(name, asks))
    finally:
        sock.close()
    got = [(r.partition, r.error_code, r.leader_epoch, r.end_offset) for r in resp.topics[0].partitions]
    assert got == [
        (0, 0, 0, 7),                                    # epoch 0 ends at the log end
        (0, 0, 0, 7),                                    # -1: no fencing
        (0, CKError.UNKNOWN_LEADER_EPOCH, -1, -1),       # client ahead of the broker
        (0, 0, -1, -1),                                  # an epoch this log never had
        (5, CKError.UNKNOWN_TOPIC_OR_PART, -1, -1),
    ]


def test_api_versions_advertises_the_new_apis(mbroker):
    from semel.protocol.messages import request_class as rc
    sock = wire.connect(mbroker.bootstrap)
    try:
        resp = wire.call(sock, 18, 3, client_software_name="t", client_software_version="1")
    finally:
        sock.close()
    keys = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    for key, lo_hi in {21: (0, 2), 23: (2, 4), 33: (0, 2), 37: (0, 3), 44: (0, 1), 45: (0, 1), 46: (0, 0),
                       60: (0, 2)}.items():
        assert keys[key] == lo_hi
        assert rc(key) is not None


def test_elect_leaders_on_a_single_node_has_nothing_to_elect(mbroker):
    from kafka.admin import KafkaAdminClient
    admin = AdminClient({"bootstrap.servers": mbroker.bootstrap})
    name = f"elect-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(30)
    kp = KafkaAdminClient(bootstrap_servers=mbroker.bootstrap)
    try:
        for election_type in (0, 1):
            resp = kp.elect_leaders(election_type, {name: [0, 1], "no-such-topic": [0]}, raise_errors=False)
            got = {(t.topic, p.partition_id): p.error_code for t in resp.replica_election_results
                   for p in t.partition_result}
            assert got == {(name, 0): 84, (name, 1): 84, ("no-such-topic", 0): 3}   # ELECTION_NOT_NEEDED
        everything = kp.elect_leaders(0, None, raise_errors=False)   # the client names every partition
        assert {p.error_code for t in everything.replica_election_results for p in t.partition_result} == {84}
    finally:
        kp.close()


def test_list_partition_reassignments_on_a_single_node_lists_none(mbroker):
    """A cluster of one reads the same partition states as a cluster: none reassigning."""
    admin = AdminClient({"bootstrap.servers": mbroker.bootstrap})
    name = f"reassign-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(30)
    T = request_class(46).ListPartitionReassignmentsTopics
    sock = wire.connect(mbroker.bootstrap)
    try:
        everything = wire.call(sock, 46, 0, timeout_ms=5000, topics=None)
        named = wire.call(sock, 46, 0, corr=2, timeout_ms=5000, topics=[T(name=name, partition_indexes=[0, 1])])
    finally:
        sock.close()
    assert (everything.error_code, everything.topics) == (0, [])
    assert (named.error_code, named.topics) == (0, [])


def _fetch_topics(name, epoch):
    T = request_class(1).FetchTopic
    return [T(topic=name, partitions=[T.FetchPartition(
        partition=0, current_leader_epoch=epoch, fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
        partition_max_bytes=1 << 20)])]


def _list_topics(name, epoch):
    T = request_class(2).ListOffsetsTopic
    return [T(name=name, partitions=[T.ListOffsetsPartition(partition_index=0, current_leader_epoch=epoch,
                                                           timestamp=-1)])]


def test_fetch_and_list_offsets_answer_as_the_leader_of_a_cluster_of_one(mbroker):
    """Epoch 0 (what Metadata advertises) and -1 are served, a newer epoch is
    UNKNOWN_LEADER_EPOCH (KIP-320), and a fetch from a broker (replica_id >= 0) is refused:
    no broker follows a single node."""
    from semel.protocol.errors import KafkaError
    name = f"fence-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": mbroker.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    p = Producer({"bootstrap.servers": mbroker.bootstrap})
    for _ in range(3):
        p.produce(name, value=b"x", partition=0)
    assert p.flush(30) == 0
    fetch = dict(max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                 forgotten_topics_data=[], rack_id="")
    sock = wire.connect(mbroker.bootstrap)
    try:
        fetched = {(who, epoch): wire.call(sock, 1, 12, replica_id=who, topics=_fetch_topics(name, epoch),
                                           **fetch).responses[0].partitions[0]
                   for who, epoch in [(-1, -1), (-1, 0), (-1, 1), (1, 0), (0, -1)]}
        listed = {epoch: wire.call(sock, 2, 7, replica_id=-1, isolation_level=0,
                                   topics=_list_topics(name, epoch)).topics[0].partitions[0]
                  for epoch in (-1, 0, 1)}
    finally:
        sock.close()
    assert {k: (r.error_code, r.high_watermark) for k, r in fetched.items()} == {
        (-1, -1): (0, 3), (-1, 0): (0, 3), (-1, 1): (KafkaError.UNKNOWN_LEADER_EPOCH, -1),
        (1, 0): (KafkaError.NOT_LEADER_OR_FOLLOWER, -1), (0, -1): (KafkaError.NOT_LEADER_OR_FOLLOWER, -1)}
    assert fetched[(-1, 0)].records and not fetched[(1, 0)].records
    assert {e: (r.error_code, r.offset, r.leader_epoch) for e, r in listed.items()} == {
        -1: (0, 3, 0), 0: (0, 3, 0), 1: (KafkaError.UNKNOWN_LEADER_EPOCH, -1, -1)}


def test_a_single_node_refuses_what_needs_more_brokers_and_deletes_by_topic_id(mbroker):
    """The one-broker admin answers alone what a cluster answers with its brokers: a
    second replica, a reassignment and the cluster-wide replication throttle are refused;
    a topic named by its id (DeleteTopics v6) is found and deleted, as in a cluster."""
    admin = AdminClient({"bootstrap.servers": mbroker.bootstrap})
    name = f"one-{uuid.uuid4().hex[:8]}"
    two = admin.create_topics([NewTopic(name + "-rf2", 1, 2)])[name + "-rf2"]
    assert two.exception(30).args[0].code() == CKError.INVALID_REPLICATION_FACTOR
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(30)
    Alter = request_class(44).AlterConfigsResource
    throttle = Alter(resource_type=4, resource_name="", configs=[Alter.AlterableConfig(
        name="leader.replication.throttled.rate", config_operation=0, value="1000")])
    Move = request_class(45).ReassignableTopic
    State = request_class(20).DeleteTopicState
    sock = wire.connect(mbroker.bootstrap)
    try:
        moved = wire.call(sock, 45, 0, timeout_ms=5000, topics=[Move(name=name, partitions=[
            Move.ReassignablePartition(partition_index=0, replicas=[0])])])
        refused = wire.call(sock, 44, 1, corr=2, resources=[throttle], validate_only=False)
        listed = wire.call(sock, 3, 12, corr=3, topics=None, allow_auto_topic_creation=False,
                           include_topic_authorized_operations=False)
        topic_id = next(t.topic_id for t in listed.topics if t.name == name)
        gone = wire.call(sock, 20, 6, corr=4, timeout_ms=5000, topics=[State(name=None, topic_id=topic_id)])
    finally:
        sock.close()
    assert [(p.error_code, p.error_message) for t in moved.responses for p in t.partitions] == [
        (CKError.INVALID_REPLICA_ASSIGNMENT, "a single node has nothing to reassign")]
    assert [r.error_code for r in refused.responses] == [CKError.INVALID_CONFIG]
    assert [(r.name, r.error_code) for r in gone.responses] == [(name, 0)]
    assert name not in admin.list_topics(timeout=30).topics


def test_acks_all_to_a_topic_asking_for_two_in_sync_replicas_is_refused_on_one_node(mbroker):
    """min.insync.replicas=2 on a single node: an acks=all record fails with
    NOT_ENOUGH_REPLICAS and nothing is written; acks=1 is taken."""
    admin = AdminClient({"bootstrap.servers": mbroker.bootstrap})
    name = f"isr2-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, 1, 1, config={"min.insync.replicas": "2"})])[name].result(30)
    outcomes = []

    def produce(conf):
        p = Producer({"bootstrap.servers": mbroker.bootstrap, "message.timeout.ms": 5000, **conf})
        p.produce(name, b"v", on_delivery=lambda err, msg: outcomes.append(err.code() if err else None))
        assert p.flush(30) == 0

    produce({"acks": "all", "retries": 0})
    produce({"acks": "1", "retries": 0})
    assert outcomes == [CKError.NOT_ENOUGH_REPLICAS, None]
    c = Consumer({"bootstrap.servers": mbroker.bootstrap, "group.id": name})
    try:
        assert c.get_watermark_offsets(TopicPartition(name, 0), timeout=30) == (0, 1)
    finally:
        c.close()
