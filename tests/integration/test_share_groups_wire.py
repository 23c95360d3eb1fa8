"""Share-group APIs byte for byte over a socket to a real broker process: what is
advertised, and Kafka's error for each bad request (a stale or unknown share session
epoch, an acknowledgement of a record another member holds, a group id of a consumer
group, a bad group config), with the broker serving on afterwards."""
from __future__ import annotations

import uuid

import pytest
from support.wire import call, connect

from semel.protocol.errors import KafkaError
from tests.support.brokers import module_broker_fixture
from tests.support.share import fill, set_group_configs
from tests.support.share_wire import ACK, API_VERSIONS, FETCH, HEARTBEAT, ack, fetch, join, topic_id


pytest.importorskip("confluent_kafka")


wire_broker = module_broker_fixture("share-wire")


def test_apis_are_advertised_at_kafka_42_versions(wire_broker):
    with connect(wire_broker.bootstrap) as s:
        r = call(s, API_VERSIONS, 3, client_software_name="t", client_software_version="1")
    served = {k.api_key: (k.min_version, k.max_version) for k in r.api_keys}
    assert served[HEARTBEAT] == (1, 1) and served[FETCH] == (1, 2) and served[ACK] == (1, 2)


def test_session_epochs_and_record_states(wire_broker):
    topic, group = f"wire-{uuid.uuid4().hex[:6]}", f"sg-wire-{uuid.uuid4().hex[:6]}"
    fill(wire_broker.bootstrap, topic, 10)
    set_group_configs(wire_broker.bootstrap, group, share_auto_offset_reset="earliest")
    with connect(wire_broker.bootstrap) as a, connect(wire_broker.bootstrap) as b:
        tid = topic_id(a, topic)
        ma, joined = join(a, group, topic)
        assert joined.member_epoch >= 1 and joined.assignment.topic_partitions[0].partitions == [0]
        mb, _ = join(b, group, topic)
        # No session yet: a positive epoch is SHARE_SESSION_NOT_FOUND.
        assert fetch(a, group, ma, 1, tid).error_code == KafkaError.SHARE_SESSION_NOT_FOUND
        got = fetch(a, group, ma, 0, tid)
        assert got.error_code == 0 and got.acquisition_lock_timeout_ms == 30000
        acquired = got.responses[0].partitions[0].acquired_records
        assert [(x.first_offset, x.last_offset, x.delivery_count) for x in acquired] == [(0, 4, 1)]
        # A stale epoch (0 was used, 1 is next; 5 is not) changes nothing.
        assert fetch(a, group, ma, 5, tid).error_code == KafkaError.INVALID_SHARE_SESSION_EPOCH
        # Member b acknowledging a's records: INVALID_RECORD_STATE, and a still holds them.
        assert fetch(b, group, mb, 0, tid, max_records=1).error_code == 0
        acked = ack(b, group, mb, 1, tid, [(0, 4, 1)], version=1)
        assert acked.responses[0].partitions[0].error_code == KafkaError.INVALID_RECORD_STATE
        # An acknowledgement far outside the window: INVALID_RECORD_STATE, at once.
        far = fetch(a, group, ma, 1, tid, acks=[(0, 1 << 62, 1)], max_records=0)
        assert far.responses[0].partitions[0].acknowledge_error_code == KafkaError.INVALID_RECORD_STATE
        # a accepts its records on its next fetch (epoch 2) and gets the next ones.
        nxt = fetch(a, group, ma, 2, tid, acks=[(0, 4, 1)], max_records=10)
        part = nxt.responses[0].partitions[0]
        assert part.acknowledge_error_code == 0
        assert all(x.first_offset >= 5 for x in part.acquired_records)


def test_a_consumer_group_id_is_not_a_share_group(wire_broker):
    from tests.support.consumer_protocol import Member
    topic, group = f"wire-cg-{uuid.uuid4().hex[:6]}", f"cg-{uuid.uuid4().hex[:6]}"
    fill(wire_broker.bootstrap, topic, 1)
    m = Member(wire_broker.bootstrap, group, [topic])
    m.start()
    try:
        import time
        deadline = time.time() + 30
        while m.count() < 1:
            assert time.time() < deadline
            time.sleep(0.2)
        with connect(wire_broker.bootstrap) as s:
            r = call(s, HEARTBEAT, 1, group_id=group, member_id=uuid.uuid4().hex[:22], member_epoch=0,
                     rack_id=None, subscribed_topic_names=[topic])
        assert r.error_code == KafkaError.GROUP_ID_NOT_FOUND
    finally:
        m.stop()


@pytest.mark.parametrize("name,value", [
    ("share.auto.offset.reset", "sometimes"),
    ("share.record.lock.duration.ms", "10"),
    ("share.delivery.count.limit", "many"),
    ("share.isolation.level", "read_mostly"),
    ("share.no.such.config", "1"),
])
def test_bad_group_configs_are_invalid_config(wire_broker, name, value):
    from confluent_kafka import KafkaException
    with pytest.raises(KafkaException) as exc:
        set_group_configs(wire_broker.bootstrap, f"sg-bad-{uuid.uuid4().hex[:6]}", **{name.replace(".", "_"): value})
    assert exc.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert name in exc.value.args[0].str()


def test_list_and_delete_share_groups(wire_broker):
    LIST, DELETE = 16, 42
    topic, group = f"wire-ld-{uuid.uuid4().hex[:6]}", f"sg-ld-{uuid.uuid4().hex[:6]}"
    fill(wire_broker.bootstrap, topic, 3)
    with connect(wire_broker.bootstrap) as s:
        member, joined = join(s, group, topic)
        listed = call(s, LIST, 5, states_filter=[], types_filter=["share"])
        rows = {(g.group_id, g.group_type, g.protocol_type, g.group_state) for g in listed.groups}
        assert (group, "share", "share", "Stable") in rows
        assert all(g.group_type == "share" for g in listed.groups)
        deleted = call(s, DELETE, 2, groups_names=[group])
        assert deleted.results[0].error_code == KafkaError.NON_EMPTY_GROUP
        left = call(s, HEARTBEAT, 1, group_id=group, member_id=member, member_epoch=-1, rack_id=None,
                    subscribed_topic_names=None)
        assert left.error_code == 0 and left.member_epoch == -1
        deleted = call(s, DELETE, 2, groups_names=[group])
        assert deleted.results[0].error_code == 0
        listed = call(s, LIST, 5, states_filter=[], types_filter=[])
        assert group not in {g.group_id for g in listed.groups}


def test_cli_lists_and_describes_share_groups(wire_broker):
    from tests.support.consumer_protocol import semel_cli
    topic, group = f"wire-cli-{uuid.uuid4().hex[:6]}", f"sg-cli-{uuid.uuid4().hex[:6]}"
    fill(wire_broker.bootstrap, topic, 3, partitions=2)
    with connect(wire_broker.bootstrap) as s:
        member, _ = join(s, group, topic)
        listed = semel_cli("group", "list", "--bootstrap", wire_broker.bootstrap)
        assert f"{group}\tStable\tshare\tshare" in listed.splitlines()
        described = semel_cli("group", "describe", group, "--bootstrap", wire_broker.bootstrap)
        assert f"group {group}: Stable, 1 member(s), share group (KIP-932), assignor simple" in described
        assert f"member {member}" in described and f"assigned {topic}-0,{topic}-1" in described


def test_a_fetch_acquires_whole_batches(wire_broker):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    topic, group = f"wire-batch-{uuid.uuid4().hex[:6]}", f"sg-batch-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": wire_broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    p = Producer({"bootstrap.servers": wire_broker.bootstrap, "linger.ms": 1000})
    for i in range(10):
        p.produce(topic, value=b"x")
    assert p.flush(30) == 0   # one batch of ten records
    set_group_configs(wire_broker.bootstrap, group, share_auto_offset_reset="earliest")
    with connect(wire_broker.bootstrap) as s:
        tid = topic_id(s, topic)
        member, _ = join(s, group, topic)
        got = fetch(s, group, member, 0, tid, max_records=3)
        acquired = got.responses[0].partitions[0].acquired_records
        assert [(x.first_offset, x.last_offset) for x in acquired] == [(0, 9)]   # past MaxRecords, to the batch end


def test_a_share_group_id_is_not_a_consumer_group(wire_broker):
    topic, group = f"wire-sg-{uuid.uuid4().hex[:6]}", f"sg-not-cg-{uuid.uuid4().hex[:6]}"
    fill(wire_broker.bootstrap, topic, 1)
    with connect(wire_broker.bootstrap) as s:
        join(s, group, topic)
        r = call(s, 68, 1, group_id=group, member_id=uuid.uuid4().hex[:22], member_epoch=0, instance_id=None,
                 rack_id=None, rebalance_timeout_ms=30000, subscribed_topic_names=[topic],
                 subscribed_topic_regex=None, server_assignor=None, topic_partitions=[])
        assert r.error_code == KafkaError.GROUP_ID_NOT_FOUND


def test_bad_heartbeats(wire_broker):
    group = f"sg-badhb-{uuid.uuid4().hex[:6]}"
    with connect(wire_broker.bootstrap) as s:
        def hb(**kw):
            fields = dict(group_id=group, member_id=uuid.uuid4().hex[:22], member_epoch=0, rack_id=None,
                          subscribed_topic_names=None)
            return call(s, HEARTBEAT, 1, **{**fields, **kw}).error_code
        assert hb() == KafkaError.INVALID_REQUEST                       # joining names no topics
        assert hb(member_id="", subscribed_topic_names=["t"]) == KafkaError.INVALID_REQUEST
        assert hb(member_epoch=3) == KafkaError.UNKNOWN_MEMBER_ID       # never joined
        listed = call(s, 16, 5, states_filter=[], types_filter=["share"])
        assert group not in {g.group_id for g in listed.groups}        # nothing was made of them


def test_describe_group_configs(wire_broker):
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
    group = f"sg-cfg-{uuid.uuid4().hex[:6]}"
    set_group_configs(wire_broker.bootstrap, group, share_isolation_level="read_committed")
    admin = AdminClient({"bootstrap.servers": wire_broker.bootstrap})
    res = ConfigResource(ResourceType.GROUP, group)
    entries = admin.describe_configs([res])[res].result(30)
    assert entries["share.isolation.level"].value == "read_committed"
    assert entries["share.auto.offset.reset"].value == "latest"          # Kafka's default
    assert entries["share.record.lock.duration.ms"].value == "30000"
    assert entries["share.delivery.count.limit"].value == "5"
    assert entries["share.partition.max.record.locks"].value == "2000"


RENEW, ACCEPT = 4, 1
# The smallest lock duration a group may set is 1000 ms; 3000 leaves room for a loaded machine.
LOCK_MS = 3000


def _acquired(resp):
    return [(x.first_offset, x.last_offset, x.delivery_count)
            for t in resp.responses for p in t.partitions for x in p.acquired_records]


def test_renew_keeps_records_past_their_lock(wire_broker):
    """v2 renewal (KIP-1222): a renewed record stays with its member after its first lock
    ran out (another member's fetch does not get it), its delivery count unchanged; then
    accept works and it is never delivered again."""
    import time
    topic, group = f"wire-renew-{uuid.uuid4().hex[:6]}", f"sg-renew-{uuid.uuid4().hex[:6]}"
    fill(wire_broker.bootstrap, topic, 3)
    set_group_configs(wire_broker.bootstrap, group, share_auto_offset_reset="earliest",
                      share_record_lock_duration_ms=str(LOCK_MS))
    with connect(wire_broker.bootstrap) as a, connect(wire_broker.bootstrap) as b:
        tid = topic_id(a, topic)
        ma, _ = join(a, group, topic)
        mb, _ = join(b, group, topic)
        got = fetch(a, group, ma, 0, tid, max_records=3, version=2)
        assert got.error_code == 0 and got.acquisition_lock_timeout_ms == LOCK_MS
        assert _acquired(got) == [(0, 2, 1)], _acquired(got)
        acquired_at = time.monotonic()
        time.sleep(LOCK_MS / 1000 * 2 / 3)
        renewed = ack(a, group, ma, 1, tid, [(0, 2, RENEW)], renew=True)
        assert renewed.error_code == 0 and renewed.acquisition_lock_timeout_ms == LOCK_MS
        assert renewed.responses[0].partitions[0].error_code == 0
        # Past the first lock's deadline: the records are still a's, b gets nothing.
        time.sleep(max(0.0, acquired_at + LOCK_MS / 1000 * 1.2 - time.monotonic()))
        other = fetch(b, group, mb, 0, tid, max_records=3, version=2, max_wait_ms=0)
        assert other.error_code == 0 and _acquired(other) == []
        # b may not renew what a holds.
        stolen = ack(b, group, mb, 1, tid, [(0, 2, RENEW)], renew=True)
        assert stolen.responses[0].partitions[0].error_code == KafkaError.INVALID_RECORD_STATE
        # A renewing ShareFetch (every size 0) renews again and acquires nothing.
        again = fetch(a, group, ma, 2, tid, acks=[(0, 2, RENEW)], version=2, is_renew_ack=True,
                       max_wait_ms=0, min_bytes=0, max_bytes=0, max_records=0)
        assert again.error_code == 0 and _acquired(again) == []
        assert again.responses[0].partitions[0].acknowledge_error_code == 0
        accepted = ack(a, group, ma, 3, tid, [(0, 2, ACCEPT)])
        assert accepted.responses[0].partitions[0].error_code == 0
        # Accepted once, delivered once: after a full lock duration nobody gets them.
        time.sleep(LOCK_MS / 1000 + 0.5)
        assert _acquired(fetch(b, group, mb, 2, tid, max_records=3, version=2, max_wait_ms=0)) == []


def test_renew_is_refused_where_kafka_refuses_it(wire_broker):
    """Renew only at v2 with IsRenewAck set; a renewing ShareFetch asks for no records."""
    topic, group = f"wire-renew-bad-{uuid.uuid4().hex[:6]}", f"sg-renew-bad-{uuid.uuid4().hex[:6]}"
    fill(wire_broker.bootstrap, topic, 2)
    set_group_configs(wire_broker.bootstrap, group, share_auto_offset_reset="earliest")
    with connect(wire_broker.bootstrap) as s:
        tid = topic_id(s, topic)
        member, _ = join(s, group, topic)
        assert _acquired(fetch(s, group, member, 0, tid, max_records=2, version=2)) == [(0, 1, 1)]
        v1 = ack(s, group, member, 1, tid, [(0, 1, RENEW)], version=1)
        assert v1.responses[0].partitions[0].error_code == KafkaError.INVALID_REQUEST
        unflagged = ack(s, group, member, 2, tid, [(0, 1, RENEW)], renew=False)
        assert unflagged.responses[0].partitions[0].error_code == KafkaError.INVALID_REQUEST
        greedy = fetch(s, group, member, 3, tid, acks=[(0, 1, RENEW)], version=2, is_renew_ack=True)
        assert greedy.error_code == KafkaError.INVALID_REQUEST
        # Nothing of that changed the records: the member still holds them and accepts them.
        assert ack(s, group, member, 3, tid, [(0, 1, ACCEPT)]).responses[0].partitions[0].error_code == 0
