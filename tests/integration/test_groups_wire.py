"""Every advertised version of the group and offset APIs, byte for byte over a
socket to a real broker process, plus OffsetFetch require_stable with a real
transactional producer (confluent-kafka send_offsets_to_transaction)."""
from __future__ import annotations

import time
import uuid

import pytest
from support.wire import call, connect

from semel.protocol.errors import KafkaError
from semel.protocol.messages import request_class

JOIN, HEARTBEAT, LEAVE, SYNC, DESCRIBE, LIST, DELETE = 11, 12, 13, 14, 15, 16, 42
COMMIT, FETCH = 8, 9


@pytest.fixture(scope="module")
def wire_broker(tmp_path_factory):
    from semel.launch.process import SemelBroker
    d = tmp_path_factory.mktemp("groups-wire")
    b = SemelBroker(d / "data", log_path=d / "broker.log",
                    extra_args=["--group-initial-rebalance-delay-ms", "0",
                                "--group-min-session-timeout-ms", "1000"])
    b.start()
    yield b
    b.close()


@pytest.fixture(scope="module")
def topic(wire_broker):
    from confluent_kafka.admin import AdminClient, NewTopic
    name = f"wire-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": wire_broker.bootstrap})
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(30)
    return name


def _join(sock, version, group, member_id="", instance=None):
    P = request_class(JOIN).JoinGroupRequestProtocol
    fields = dict(group_id=group, session_timeout_ms=10000, member_id=member_id, protocol_type="consumer",
                  protocols=[P(name="range", metadata=b"\x00\x01meta")])
    if version >= 1:
        fields["rebalance_timeout_ms"] = 10000
    if version >= 5:
        fields["group_instance_id"] = instance
    return call(sock, JOIN, version, **fields)


def _join_alone(sock, group, assignment):
    """Join `group` as its only member (generation 1) and sync with `assignment`; the join's answer."""
    res = _join(sock, 3, group)
    A = request_class(SYNC).SyncGroupRequestAssignment
    call(sock, SYNC, 3, group_id=group, generation_id=1, member_id=res.member_id,
         assignments=[A(member_id=res.member_id, assignment=assignment)])
    return res


@pytest.mark.parametrize("version", range(0, 8))
def test_join_sync_heartbeat_leave_every_version(wire_broker, version):
    group = f"wire-g{version}-{uuid.uuid4().hex[:6]}"
    sock = connect(wire_broker.bootstrap, timeout=30)
    try:
        res = _join(sock, version, group)
        if version >= 4:
            assert res.error_code == KafkaError.MEMBER_ID_REQUIRED and res.member_id
            res = _join(sock, version, group, res.member_id)
        assert res.error_code == KafkaError.NONE
        assert res.generation_id == 1 and res.leader == res.member_id
        assert [(m.member_id, m.metadata) for m in res.members] == [(res.member_id, b"\x00\x01meta")]
        if version >= 7:
            assert res.protocol_type == "consumer"
        member, gen = res.member_id, res.generation_id
        A = request_class(SYNC).SyncGroupRequestAssignment
        sync_version = min(version, 5)
        fields = dict(group_id=group, generation_id=gen, member_id=member,
                      assignments=[A(member_id=member, assignment=b"assigned")])
        if sync_version >= 5:
            fields.update(protocol_type="consumer", protocol_name="range")
        s = call(sock, SYNC, sync_version, **fields)
        assert (s.error_code, s.assignment) == (KafkaError.NONE, b"assigned")
        hb_version = min(version, 4)
        assert call(sock, HEARTBEAT, hb_version, group_id=group, generation_id=gen,
                    member_id=member).error_code == KafkaError.NONE
        assert call(sock, HEARTBEAT, hb_version, group_id=group, generation_id=gen + 1,
                    member_id=member).error_code == KafkaError.ILLEGAL_GENERATION
        leave_version = min(version, 4)
        if leave_version >= 3:
            M = request_class(LEAVE).MemberIdentity
            r = call(sock, LEAVE, leave_version, group_id=group,
                     members=[M(member_id=member), M(member_id="ghost")])
            assert r.error_code == KafkaError.NONE
            assert [(m.member_id, m.error_code) for m in r.members] == [
                (member, KafkaError.NONE), ("ghost", KafkaError.UNKNOWN_MEMBER_ID)]
        else:
            assert call(sock, LEAVE, leave_version, group_id=group, member_id=member).error_code == KafkaError.NONE
            assert call(sock, LEAVE, leave_version, group_id=group,
                        member_id=member).error_code == KafkaError.UNKNOWN_MEMBER_ID
        d = call(sock, DESCRIBE, min(version, 5), groups=[group])
        assert d.groups[0].group_state == "Empty" and d.groups[0].members == []
    finally:
        sock.close()


def test_join_errors(wire_broker):
    sock = connect(wire_broker.bootstrap, timeout=30)
    try:
        P = request_class(JOIN).JoinGroupRequestProtocol
        r = call(sock, JOIN, 5, group_id="g-bad", session_timeout_ms=10, rebalance_timeout_ms=1000,
                 member_id="", protocol_type="consumer", protocols=[P(name="range", metadata=b"")])
        assert r.error_code == KafkaError.INVALID_SESSION_TIMEOUT
        r = call(sock, JOIN, 5, group_id="", session_timeout_ms=10000, rebalance_timeout_ms=1000,
                 member_id="", protocol_type="consumer", protocols=[P(name="range", metadata=b"")])
        assert r.error_code == KafkaError.INVALID_GROUP_ID
        r = call(sock, JOIN, 5, group_id="g-unknown", session_timeout_ms=10000, rebalance_timeout_ms=1000,
                 member_id="made-up", protocol_type="consumer", protocols=[P(name="range", metadata=b"")])
        assert r.error_code == KafkaError.UNKNOWN_MEMBER_ID
        r = call(sock, SYNC, 3, group_id="g-unknown", generation_id=1, member_id="x", assignments=[])
        assert r.error_code == KafkaError.UNKNOWN_MEMBER_ID
    finally:
        sock.close()


def test_describe_list_delete(wire_broker, topic):
    group = f"wire-dl-{uuid.uuid4().hex[:6]}"
    sock = connect(wire_broker.bootstrap, timeout=30)
    try:
        res = _join_alone(sock, group, b"a")
        d = call(sock, DESCRIBE, 5, groups=[group, "wire-missing"])
        g, missing = d.groups
        assert (g.group_state, g.protocol_type, g.protocol_data) == ("Stable", "consumer", "range")
        assert [(m.member_id, m.member_metadata, m.member_assignment) for m in g.members] == [
            (res.member_id, b"\x00\x01meta", b"a")]
        assert g.members[0].client_id == "test" and g.members[0].client_host == "/127.0.0.1"
        assert missing.group_state == "Dead" and missing.error_code == KafkaError.NONE
        listed = call(sock, LIST, 4, states_filter=["Stable"])
        assert (group, "Stable") in {(x.group_id, x.group_state) for x in listed.groups}
        assert group not in {x.group_id for x in call(sock, LIST, 4, states_filter=["Empty"]).groups}
        assert group in {x.group_id for x in call(sock, LIST, 0).groups}
        r = call(sock, DELETE, 2, groups_names=[group, "wire-missing"])
        assert {(x.group_id, x.error_code) for x in r.results} == {
            (group, KafkaError.NON_EMPTY_GROUP), ("wire-missing", KafkaError.GROUP_ID_NOT_FOUND)}
        call(sock, LEAVE, 0, group_id=group, member_id=res.member_id)
        r = call(sock, DELETE, 0, groups_names=[group])
        assert [(x.group_id, x.error_code) for x in r.results] == [(group, KafkaError.NONE)]
        assert group not in {x.group_id for x in call(sock, LIST, 2).groups}
    finally:
        sock.close()


def _commit(sock, version, group, topic, offsets, generation=-1, member=""):
    T = request_class(COMMIT).OffsetCommitRequestTopic
    P = T.OffsetCommitRequestPartition
    fields = dict(group_id=group, generation_id_or_member_epoch=generation, member_id=member,
                  topics=[T(name=topic, partitions=[P(partition_index=p, committed_offset=o,
                                                      committed_metadata=f"md{o}",
                                                      **({"committed_leader_epoch": 3} if version >= 6 else {}))
                                                    for p, o in offsets.items()])])
    if version <= 4:
        fields["retention_time_ms"] = -1
    return call(sock, COMMIT, version, **fields)


def _fetch(sock, version, group, topic, partitions, require_stable=False):
    T = request_class(FETCH).OffsetFetchRequestTopic
    topics = None if partitions is None else [T(name=topic, partition_indexes=partitions)]
    fields = dict(group_id=group, topics=topics)
    if version >= 7:
        fields["require_stable"] = require_stable
    r = call(sock, FETCH, version, **fields)
    return r, {(t.name, p.partition_index): (p.committed_offset, p.metadata, p.error_code)
               for t in r.topics for p in t.partitions}


@pytest.mark.parametrize("version", range(2, 9))
def test_offset_commit_and_fetch_every_version(wire_broker, topic, version):
    group = f"wire-oc{version}-{uuid.uuid4().hex[:6]}"
    sock = connect(wire_broker.bootstrap, timeout=30)
    try:
        r = _commit(sock, version, group, topic, {0: 10 + version, 1: 20 + version})
        assert {(p.partition_index, p.error_code) for t in r.topics for p in t.partitions} == {
            (0, KafkaError.NONE), (1, KafkaError.NONE)}
        r = _commit(sock, version, group, "no-such-topic", {0: 1})
        assert r.topics[0].partitions[0].error_code == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
        fetch_version = min(version - 1, 7) if version > 2 else 1
        for fv in sorted({1, fetch_version, 7}):
            _, got = _fetch(sock, fv, group, topic, [0, 1, 5])
            assert got == {(topic, 0): (10 + version, f"md{10 + version}", 0),
                           (topic, 1): (20 + version, f"md{20 + version}", 0),
                           (topic, 5): (-1, "", 0)}
        r, got = _fetch(sock, 2, group, topic, None)
        assert r.error_code == 0 and set(got) == {(topic, 0), (topic, 1)}
        r = call(sock, FETCH, 5, group_id=group, topics=[request_class(FETCH).OffsetFetchRequestTopic(
            name=topic, partition_indexes=[0])])
        expected_epoch = 3 if version >= 6 else -1
        assert r.topics[0].partitions[0].committed_leader_epoch == expected_epoch
    finally:
        sock.close()


def test_commit_by_a_member_is_checked(wire_broker, topic):
    group = f"wire-member-{uuid.uuid4().hex[:6]}"
    sock = connect(wire_broker.bootstrap, timeout=30)
    try:
        res = _join_alone(sock, group, b"")

        def err(r):
            return r.topics[0].partitions[0].error_code
        assert err(_commit(sock, 8, group, topic, {0: 1}, 1, res.member_id)) == KafkaError.NONE
        assert err(_commit(sock, 8, group, topic, {0: 1}, 7, res.member_id)) == KafkaError.ILLEGAL_GENERATION
        assert err(_commit(sock, 8, group, topic, {0: 1}, 1, "other")) == KafkaError.UNKNOWN_MEMBER_ID
        assert err(_commit(sock, 8, group, topic, {0: 1})) == KafkaError.UNKNOWN_MEMBER_ID
    finally:
        sock.close()


@pytest.mark.timeout(180)
def test_require_stable_sees_pending_transactional_offsets(wire_broker, topic):
    from confluent_kafka import Consumer, Producer, TopicPartition
    group = f"wire-txn-{uuid.uuid4().hex[:6]}"
    p = Producer({"bootstrap.servers": wire_broker.bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:6]}"})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, b"v", partition=0)
    c = Consumer({"bootstrap.servers": wire_broker.bootstrap, "group.id": group})
    p.send_offsets_to_transaction([TopicPartition(topic, 0, 42)], c.consumer_group_metadata(), 30)
    sock = connect(wire_broker.bootstrap, timeout=30)
    try:
        _, got = _fetch(sock, 7, group, topic, [0], require_stable=True)
        assert got[(topic, 0)][2] == KafkaError.UNSTABLE_OFFSET_COMMIT
        _, got = _fetch(sock, 7, group, topic, [0], require_stable=False)
        assert got[(topic, 0)] == (-1, "", 0)
        p.commit_transaction(30)
        deadline = time.monotonic() + 30
        while True:   # the marker reaches __consumer_offsets right after EndTxn
            _, got = _fetch(sock, 7, group, topic, [0], require_stable=True)
            if got[(topic, 0)][2] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert got[(topic, 0)][:1] == (42,) and got[(topic, 0)][2] == 0
    finally:
        sock.close()
        c.close()
