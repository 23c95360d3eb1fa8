"""The control plane on real processes: etcd and three semel brokers (one set for the
module, lease TTL 2 s), driven by unmodified confluent-kafka, kafka-python and aiokafka.

Metadata lists the brokers and spreads leaders; clients reach each partition's leader;
other brokers refuse it; a SIGKILLed broker's partitions get new leaders from the ISR
with a new epoch and stale epochs are fenced; the controller seat moves when its broker
dies; producer ids stay unique across brokers and a full restart.

The tests run in file order and leave the cluster whole (every broker restarted).
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from semel.client import admin as admin_ops, txn
from semel.client.client import Client, ClientError
from semel.client.txn import TxnState
from semel.protocol.errors import KafkaError
from semel.protocol.messages import request_class
from semel.protocol.records import build_batch
from tests.support import wire
from tests.support.admin import error_code
from tests.support.cluster import agreed, key_leader, metadata, module_cluster, partitions, wait_brokers
from tests.support.consume import read_values
from tests.support.markers import starts_processes
from tests.support.wait import until

RF3, RF1 = "spread3", "single1"
PIDS: list[int] = []     # every producer id handed out in this module


@pytest.fixture(scope="module")
@starts_processes
def cluster(tmp_path_factory):
    with module_cluster(tmp_path_factory, "cluster") as c:
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        futures = admin.create_topics([NewTopic(RF3, 6, 3), NewTopic(RF1, 3, 1)])
        assert {t: error_code(f) for t, f in futures.items()} == {RF3: 0, RF1: 0}
        until(lambda: all(len(partitions(c, t)) == n for t, n in ((RF3, 6), (RF1, 3))), "topics visible")
        yield c


def test_metadata_lists_every_broker_and_spreads_leaders(cluster):
    md = metadata(cluster)
    assert sorted(b.node_id for b in md.brokers) == [0, 1, 2]
    assert {b.port for b in md.brokers} == {b.port for b in cluster.brokers}
    assert md.controller_id in (0, 1, 2)
    rf3 = partitions(cluster, RF3)
    assert Counter(leader for leader, _, _, _ in rf3.values()) == {0: 2, 1: 2, 2: 2}
    for leader, epoch, replicas, isr in rf3.values():
        assert sorted(replicas) == [0, 1, 2] and replicas[0] == leader and epoch == 0
        assert sorted(isr) == [0, 1, 2]
    assert sorted(leader for leader, _, _, _ in partitions(cluster, RF1).values()) == [0, 1, 2]
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})   # kept: its futures die with it
    described = admin.describe_cluster().result(30)
    assert sorted(n.id for n in described.nodes) == [0, 1, 2]
    assert described.controller.id == md.controller_id


def test_create_topics_checks_replication_factor(cluster):
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    (fut,) = admin.create_topics([NewTopic("too-many", 1, 4)]).values()
    assert error_code(fut) == KafkaError.INVALID_REPLICATION_FACTOR
    (fut,) = admin.create_topics([NewTopic(RF1, 1, 1)]).values()
    assert error_code(fut) == KafkaError.TOPIC_ALREADY_EXISTS


def _produce_confluent(bootstrap, topic, n, tag):
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, value=f"{tag}-{i}".encode(), partition=i % 3)
    assert p.flush(60) == 0


def _produce_kafka_python(bootstrap, topic, n, tag):
    from kafka import KafkaProducer
    p = KafkaProducer(bootstrap_servers=bootstrap.split(","), acks="all")
    for i in range(n):
        p.send(topic, value=f"{tag}-{i}".encode(), partition=i % 3).get(timeout=60)
    p.close()


async def _produce_aiokafka(bootstrap, topic, n, tag):
    from aiokafka import AIOKafkaProducer
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await p.start()
    try:
        for i in range(n):
            await p.send_and_wait(topic, f"{tag}-{i}".encode(), partition=i % 3)
    finally:
        await p.stop()


def _consume_kafka_python(bootstrap, topic, want):
    from kafka import KafkaConsumer, TopicPartition
    c = KafkaConsumer(bootstrap_servers=bootstrap.split(","), enable_auto_commit=False,
                      auto_offset_reset="earliest", consumer_timeout_ms=3000)
    c.assign([TopicPartition(topic, p) for p in range(3)])
    got = []
    for m in c:
        got.append(m.value.decode())
        if len(got) >= want:
            break
    c.close()
    return got


async def _consume_aiokafka(bootstrap, topic, want):
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await c.start()
    try:
        c.assign([TopicPartition(topic, p) for p in range(3)])
        got = []
        while len(got) < want:
            batch = await asyncio.wait_for(c.getmany(timeout_ms=500), 60)
            got += [m.value.decode() for ms in batch.values() for m in ms]
        return got
    finally:
        await c.stop()


@pytest.mark.parametrize("topic", [RF1, RF3])
def test_unmodified_clients_produce_and_consume_through_the_leaders(cluster, topic):
    topic_name = f"{topic}-clients"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    (fut,) = admin.create_topics([NewTopic(topic_name, 3, 3 if topic == RF3 else 1)]).values()
    assert error_code(fut) == 0
    until(lambda: len(partitions(cluster, topic_name)) == 3, "topic visible")
    _produce_confluent(cluster.bootstrap, topic_name, 30, "ck")
    _produce_kafka_python(cluster.bootstrap, topic_name, 30, "kp")
    asyncio.run(_produce_aiokafka(cluster.bootstrap, topic_name, 30, "aio"))
    want = sorted(f"{tag}-{i}" for tag in ("ck", "kp", "aio") for i in range(30))
    assert sorted(read_values(cluster.bootstrap, topic_name, 3, want=90)) == want
    assert sorted(_consume_kafka_python(cluster.bootstrap, topic_name, 90)) == want
    assert sorted(asyncio.run(_consume_aiokafka(cluster.bootstrap, topic_name, 90))) == want


def test_consumer_group_commits_at_the_coordinator_broker(cluster):
    from confluent_kafka import Consumer, TopicPartition
    topic = "grouped"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})   # kept: its futures die with it
    (fut,) = admin.create_topics([NewTopic(topic, 3, 1)]).values()
    assert error_code(fut) == 0
    until(lambda: len(partitions(cluster, topic)) == 3, "topic visible")
    _produce_confluent(cluster.bootstrap, topic, 30, "g")
    # The coordinator of a key is the leader of the key's internal partition (created at
    # the first FindCoordinator), whichever broker is asked.
    def coordinator(key_type):
        answers = set()
        for b in cluster.brokers:
            with Client(b.bootstrap) as c:
                r = c.request(10, key="g-cluster", key_type=key_type)
                answers.add((r.error_code, r.node_id))
        return answers.pop() if len(answers) == 1 and min(answers)[0] == 0 else None
    group_coord = until(lambda: coordinator(0), "every broker names one group coordinator")[1]
    txn_coord = until(lambda: coordinator(1), "every broker names one transaction coordinator")[1]
    assert group_coord == key_leader(cluster, "__consumer_offsets", "g-cluster")
    assert txn_coord == key_leader(cluster, "__transaction_state", "g-cluster")
    # A broker that does not coordinate refuses coordinator requests, so a client with a
    # stale coordinator finds the current one instead of splitting the group.
    def heartbeat(broker):
        with wire.connect(broker.bootstrap) as sock:
            r = wire.call(sock, 12, 4, group_id="g-cluster", generation_id=1, member_id="m", group_instance_id=None)
            return KafkaError(r.error_code)
    assert heartbeat(cluster.brokers[(group_coord + 1) % 3]) == KafkaError.NOT_COORDINATOR
    until(lambda: heartbeat(cluster.brokers[group_coord]) == KafkaError.UNKNOWN_MEMBER_ID, "the group coordinator")
    with Client(cluster.brokers[(txn_coord + 1) % 3].bootstrap) as c:
        err, st = txn.init_producer_id(c, "g-cluster", 60_000)   # txn_coord is this id's coordinator
        assert err == KafkaError.NOT_COORDINATOR
        tps = [(topic, 0), (topic, 1)]
        assert set(txn.add_partitions(c, TxnState("g-cluster", 5, 0), tps).values()) == {KafkaError.NOT_COORDINATOR}
    with Client(cluster.brokers[(group_coord + 1) % 3].bootstrap) as c:
        assert set(admin_ops.commit_offsets(c, "g-cluster", {tp: 1 for tp in tps}).values()) == {
            KafkaError.NOT_COORDINATOR}
        with pytest.raises(ClientError, match="NOT_COORDINATOR"):
            admin_ops.fetch_offsets(c, "g-cluster")
    conf = {"bootstrap.servers": cluster.bootstrap, "group.id": "g-cluster", "auto.offset.reset": "earliest",
            "enable.auto.commit": False}
    c = Consumer(conf)
    c.subscribe([topic])
    got = []

    def polled():
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value().decode())
        return len(got) >= 30
    until(polled, "30 records through the group")
    c.commit(asynchronous=False)
    c.close()
    assert sorted(got) == sorted(f"g-{i}" for i in range(30))
    c = Consumer(conf)
    committed = c.committed([TopicPartition(topic, p) for p in range(3)], timeout=30)
    c.close()
    assert sum(tp.offset for tp in committed) == 30


def _produce_raw(client, topic, partition):
    T = request_class(0).TopicProduceData
    data = T(name=topic, partition_data=[T.PartitionProduceData(index=partition, records=build_batch([(None, b"x")]))])
    resp = client.request(0, transactional_id=None, acks=1, timeout_ms=10_000, topic_data=[data])
    return KafkaError(resp.responses[0].partition_responses[0].error_code)


def _list_offsets(client, topic, partition, leader_epoch, answer_epoch=None):
    T = request_class(2).ListOffsetsTopic
    resp = client.request(2, replica_id=-1, isolation_level=0, topics=[T(
        name=topic, partitions=[T.ListOffsetsPartition(partition_index=partition, current_leader_epoch=leader_epoch,
                                                      timestamp=-1)])])
    p = resp.topics[0].partitions[0]
    if answer_epoch is not None:
        assert p.leader_epoch == answer_epoch
    return KafkaError(p.error_code)


def _fetch(client, topic, partition, leader_epoch):
    T = request_class(1).FetchTopic
    resp = client.request(1, replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                          session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
                          topics=[T(topic=topic, partitions=[T.FetchPartition(
                              partition=partition, current_leader_epoch=leader_epoch, fetch_offset=0,
                              last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)])])
    return KafkaError(resp.responses[0].partitions[0].error_code)


def test_brokers_refuse_partitions_they_do_not_lead_and_wrong_epochs(cluster):
    leader, epoch, _, _ = partitions(cluster, RF1)[0]
    other = (leader + 1) % 3
    with Client(cluster.brokers[other].bootstrap) as c:
        assert _produce_raw(c, RF1, 0) == KafkaError.NOT_LEADER_OR_FOLLOWER
        assert _fetch(c, RF1, 0, -1) == KafkaError.NOT_LEADER_OR_FOLLOWER
        assert _list_offsets(c, RF1, 0, -1) == KafkaError.NOT_LEADER_OR_FOLLOWER
    with Client(cluster.brokers[leader].bootstrap) as c:
        assert _produce_raw(c, RF1, 0) == KafkaError.NONE
        assert _fetch(c, RF1, 0, epoch) == KafkaError.NONE
        assert _fetch(c, RF1, 0, epoch + 1) == KafkaError.UNKNOWN_LEADER_EPOCH
        assert _list_offsets(c, RF1, 0, epoch + 1) == KafkaError.UNKNOWN_LEADER_EPOCH


def _init_pids(cluster, per_broker=3) -> list[int]:
    out = []
    for b in cluster.brokers:
        with Client(b.bootstrap) as c:
            for _ in range(per_broker):
                r = c.request(22, transactional_id=None, transaction_timeout_ms=60_000, producer_id=-1,
                              producer_epoch=-1)
                assert r.error_code == 0
                out.append(r.producer_id)
    PIDS.extend(out)
    return out


def test_producer_ids_are_unique_across_brokers(cluster):
    got = _init_pids(cluster)
    assert len(set(got)) == len(got) == 9


def _controller(cluster):
    return metadata(cluster).controller_id


def _produce_each_partition(bootstrap, tag) -> list[str]:
    """Two records per RF3 partition with acks=all; the values acknowledged."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    values = [f"{tag}-{i}" for i in range(12)]
    for i, v in enumerate(values):
        p.produce(RF3, value=v.encode(), partition=i % 6)
    assert p.flush(60) == 0
    return values


def test_sigkilled_broker_loses_leadership_to_the_isr_and_gets_its_own_back(cluster):
    victim = next(n for n in range(3) if n != _controller(cluster))
    before3, before1 = partitions(cluster, RF3), partitions(cluster, RF1)
    acked = _produce_each_partition(cluster.bootstrap, "before")    # acks=all: on every ISR member
    cluster.brokers[victim].kill()
    wait_brokers(cluster, {0, 1, 2} - {victim})

    def elected():
        now = partitions(cluster, RF3)
        return all(leader != victim and victim not in isr for leader, _, _, isr in now.values()) and now
    after3 = until(elected, f"partitions led by {victim} re-elected")
    for p, (leader, epoch, replicas, isr) in after3.items():
        old_leader, old_epoch, _, old_isr = before3[p]
        if old_leader == victim:
            assert leader in old_isr and epoch == old_epoch + 1
        else:   # leaders that did not die stay where they are, epoch unchanged
            assert (leader, epoch) == (old_leader, old_epoch)
    (lost,) = [p for p, st in before1.items() if st[0] == victim]
    after1 = until(lambda: partitions(cluster, RF1)[lost][0] == -1 and partitions(cluster, RF1), "offline")
    assert after1[lost][1] == before1[lost][1] + 1 and after1[lost][3] == (victim,)   # no unclean election

    # A client still on the old epoch is fenced at the new leader; clients move on.
    moved = next(p for p, st in before3.items() if st[0] == victim)
    new_leader, new_epoch = after3[moved][0], after3[moved][1]
    with Client(cluster.brokers[new_leader].bootstrap) as c:
        assert _fetch(c, RF3, moved, new_epoch - 1) == KafkaError.FENCED_LEADER_EPOCH
        assert _list_offsets(c, RF3, moved, new_epoch - 1) == KafkaError.FENCED_LEADER_EPOCH
        assert _list_offsets(c, RF3, moved, new_epoch, answer_epoch=new_epoch) == KafkaError.NONE
    live = ",".join(b.bootstrap for b in cluster.brokers if b.alive())
    acked += _produce_each_partition(live, "after")
    # Everything acknowledged before and after the failover, once, from the new leaders.
    assert sorted(read_values(live, RF3, 6, want=len(acked))) == sorted(acked)

    cluster.brokers[victim].start()
    wait_brokers(cluster, {0, 1, 2})
    back = until(lambda: partitions(cluster, RF1)[lost][0] == victim and partitions(cluster, RF1), "back")
    assert back[lost][1] == after1[lost][1] + 1
    assert {p: st[:2] for p, st in partitions(cluster, RF3).items()} == {p: st[:2] for p, st in after3.items()}


def _seat(cluster):
    """(controller,) once every live broker names the same one, else None."""
    def named(b):
        with Client(b.bootstrap) as c:
            return c.metadata([]).controller_id
    return agreed(named(b) for b in cluster.brokers if b.alive())


def test_controller_failover(cluster):
    old = _controller(cluster)
    led = {p for p, st in partitions(cluster, RF3).items() if st[0] == old}
    cluster.brokers[old].kill()
    (new,) = until(lambda: (s := _seat(cluster)) != (old,) and s, "another broker takes the seat")
    assert new in {0, 1, 2} - {old}
    until(lambda: all(partitions(cluster, RF3)[p][0] not in (old, -1) for p in led),
          "the new controller re-elects the old one's partitions")
    cluster.brokers[old].start()
    wait_brokers(cluster, {0, 1, 2})
    # A returning broker does not take the seat back.
    assert until(lambda: _seat(cluster), "the brokers agree on the seat") == (new,)


def test_brokers_ride_out_an_etcd_restart(cluster):
    """etcd SIGKILLed and restarted on its data: sessions survive (etcd renews leases on
    start), every broker's watch resumes and new metadata reaches all of them. Down longer
    than the lease, etcd fences every broker meanwhile (none can tell it from being cut
    off); each then leads its partitions again at a new epoch: leaders stay, epochs grow
    by one at most. An admin client that first met the cluster while no broker knew the
    controller still creates a topic once etcd is back: a fenced broker names another as
    controller rather than none, which librdkafka would wait on for its whole timeout."""
    leaders = {p: st[:2] for p, st in partitions(cluster, RF3).items()}
    cluster.etcd.kill()
    time.sleep(cluster.lease_ttl_s + 1)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    assert admin.list_topics(timeout=10).controller_id in (0, 1, 2)
    cluster.etcd.start()
    (fut,) = admin.create_topics([NewTopic("after-etcd", 3, 2)]).values()
    assert error_code(fut) == 0
    for b in cluster.brokers:
        with Client(b.bootstrap) as c:
            until(lambda: [t.error_code for t in c.metadata(["after-etcd"]).topics] == [0],
                  f"broker at {b.bootstrap} sees the new topic")
    wait_brokers(cluster, {0, 1, 2})
    after = {p: st[:2] for p, st in partitions(cluster, RF3).items()}
    assert {p: st[0] for p, st in after.items()} == {p: st[0] for p, st in leaders.items()}
    assert all(after[p][1] - leaders[p][1] in (0, 1) for p in leaders), (leaders, after)


def test_producer_ids_stay_unique_across_a_full_restart(cluster):
    before = set(PIDS) | set(_init_pids(cluster))
    cluster.stop()
    cluster.start()
    wait_brokers(cluster, {0, 1, 2})
    after = _init_pids(cluster)
    assert len(set(after)) == len(after) and not set(after) & before
    assert min(after) > max(before)
    # Each broker left cleanly (lease revoked); back together, every partition has a leader again.
    until(lambda: all(st[0] in (0, 1, 2) for t in (RF3, RF1) for st in partitions(cluster, t).values()),
          "every partition led after the restart")
