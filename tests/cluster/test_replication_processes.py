"""Replication on a real local cluster: etcd and three broker processes
(semel.launch.local_cluster), unmodified confluent-kafka clients, real signals.

- acks=all while the partition's leader is SIGKILLed: every acknowledged record is
  there exactly once once the cluster settles, and all replicas agree byte for byte;
- a follower stopped (SIGSTOP) past replica.lag.time.max.ms leaves the ISR and joins
  again after SIGCONT;
- a retry of a batch the leader already holds, sent while the ISR is below
  min.insync.replicas, waits for the ISR and gets its original offset instead of
  NOT_ENOUGH_REPLICAS (which a producer takes for "not written");
- a follower SIGKILLed and restarted under a heavy acks=all load (fetches large enough
  to be written in worker threads), across leader changes: every replica's partition
  files equal the leader's byte for byte up to the high watermark, and every
  acknowledged record is there once.
"""
from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from semel.client.client import Client
from semel.protocol.api_keys import ApiKey
from semel.protocol.errors import KafkaError
from semel.protocol.messages import request_class
from semel.protocol.records import build_batch, iter_batches
from tests.support.cluster import module_cluster, partitions, wait_brokers
from tests.support.consume import read_values
from tests.support.markers import starts_processes
from tests.support.wait import until

LAG_MS = 1000


@pytest.fixture(scope="module")
@starts_processes
def cluster(tmp_path_factory):
    with module_cluster(tmp_path_factory, "replication", 3, 6, "--replica-lag-time-max-ms", str(LAG_MS),
                        "--replica-fetch-wait-max-ms", "100") as c:
        yield c


def create(cluster, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3, config={"min.insync.replicas": "2"})])[topic].result(30)
    until(lambda: len(partitions(cluster, topic)[0][3]) == 3, f"{topic}: leader and a full ISR")


def log_files(cluster, topic: str) -> list[bytes]:
    """Each broker's segment files of partition 0, concatenated."""
    out = []
    for b in cluster.brokers:
        files = sorted(b.data_dir.glob(f"{topic}-0/*.log"))
        out.append(b"".join(f.read_bytes() for f in files))
    return out


def test_acks_all_survives_a_sigkilled_leader_exactly_once(cluster):
    create(cluster, "kill")
    leader = partitions(cluster, "kill")[0][0]
    acked, failed = [], []
    halfway = threading.Event()

    def delivered(err, msg):
        (failed if err else acked).append(msg.value())
        if len(acked) >= 1000:
            halfway.set()
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 5, "topic.metadata.refresh.interval.ms": 500, "message.timeout.ms": 60000})
    for i in range(4000):
        p.produce("kill", value=b"%06d" % i, partition=0, on_delivery=delivered)
        p.poll(0)
        if i == 2000:
            assert p.flush(30) == 0 and halfway.is_set()
            cluster.brokers[leader].kill()
    assert p.flush(90) == 0
    assert failed == []
    new_leader = partitions(cluster, "kill")[0][0]
    assert new_leader not in (leader, -1)
    cluster.brokers[leader].restart()
    wait_brokers(cluster, {0, 1, 2})
    until(lambda: len(partitions(cluster, "kill")[0][3]) == 3, "the killed broker back in the ISR")
    got = read_values(cluster.bootstrap, "kill", 1, "read_uncommitted", idle_s=2.0, want=len(acked))
    assert sorted(got) == sorted(v.decode() for v in acked)      # every acknowledged record, once
    assert len(acked) == 4000
    until(lambda: len(set(log_files(cluster, "kill"))) == 1, "three identical replicas")


def test_a_stopped_follower_leaves_the_isr_and_rejoins(cluster):
    create(cluster, "pause")
    leader, _, replicas, _ = partitions(cluster, "pause")[0]
    follower = next(r for r in replicas if r != leader)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5})
    cluster.brokers[follower].pause()
    try:
        for i in range(200):
            p.produce("pause", value=b"p%d" % i, partition=0)
        assert p.flush(30) == 0        # completes once the stopped follower is out of the ISR
        until(lambda: follower not in partitions(cluster, "pause")[0][3], "follower out of the ISR", 10)
    finally:
        cluster.brokers[follower].resume()
    until(lambda: follower in partitions(cluster, "pause")[0][3], "follower back in the ISR", 30)
    until(lambda: len(set(log_files(cluster, "pause"))) == 1, "the follower caught up byte for byte")


def _produce(c, topic: str, batch: bytes, timeout_ms: int) -> tuple[KafkaError, int]:
    T = request_class(ApiKey.PRODUCE).TopicProduceData
    resp = c.request(ApiKey.PRODUCE, transactional_id=None, acks=-1, timeout_ms=timeout_ms,
                     topic_data=[T(name=topic, partition_data=[T.PartitionProduceData(index=0, records=batch)])])
    p = resp.responses[0].partition_responses[0]
    return KafkaError(p.error_code), p.base_offset


def test_a_retry_of_a_stored_batch_below_min_isr_waits_for_the_isr(cluster):
    """NOT_ENOUGH_REPLICAS says nothing was written: librdkafka's idempotent producer may
    then renumber the records under a new epoch and write them twice. A retry of a batch
    the leader holds waits for the ISR instead (NOT_ENOUGH_REPLICAS_AFTER_APPEND, "maybe
    written", when its timeout runs out first); a new batch is refused as before."""
    create(cluster, "held")
    leader = partitions(cluster, "held")[0][0]
    followers = [cluster.brokers[n] for n in range(3) if n != leader]
    at_leader = cluster.brokers[leader].bootstrap
    with Client(at_leader, timeout_s=90) as c, Client(at_leader) as look:
        r = c.request(ApiKey.INIT_PRODUCER_ID, transactional_id=None, transaction_timeout_ms=60000,
                      producer_id=-1, producer_epoch=-1)
        ids = dict(producer_id=r.producer_id, producer_epoch=r.producer_epoch)
        stored = build_batch([(None, b"once")], base_sequence=0, **ids)
        assert _produce(c, "held", stored, 30000) == (KafkaError.NONE, 0)
        answer: list = []
        held = threading.Thread(target=lambda: answer.append(_produce(c, "held", stored, 60000)))
        for b in followers:
            b.pause()
        try:
            until(lambda: look.metadata(["held"]).topics[0].partitions[0].isr_nodes == [leader],
                  "the ISR down to the leader", 30)
            fresh = build_batch([(None, b"new")], base_sequence=1, **ids)
            assert _produce(c, "held", fresh, 1000)[0] == KafkaError.NOT_ENOUGH_REPLICAS
            assert _produce(c, "held", stored, 1000)[0] == KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND
            held.start()
            time.sleep(1)
            assert not answer, "answered while the ISR is below min.insync.replicas"
        finally:
            for b in followers:
                b.resume()
        held.join(90)
    assert answer == [(KafkaError.NONE, 0)]
    assert read_values(cluster.bootstrap, "held", 1, want=1) == ["once"]


def high_watermark(cluster, topic: str) -> int:
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "hw"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        c.close()


def below(data: bytes, offset: int) -> bytes:
    """The whole batches of a replica's files below `offset`."""
    end = 0
    for pos, hdr in iter_batches(data):
        if hdr.next_offset > offset:
            break
        end = pos + hdr.size
    return data[:end]


def test_a_follower_killed_under_load_across_leader_changes_keeps_the_leaders_bytes(cluster):
    create(cluster, "fence")
    leader, _, replicas, _ = partitions(cluster, "fence")[0]
    follower, third = (r for r in replicas if r != leader)
    acked, stop = [], threading.Event()

    def produce() -> None:
        p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                      "linger.ms": 20, "batch.size": 1 << 20, "topic.metadata.refresh.interval.ms": 500,
                      "message.timeout.ms": 60000})
        i = 0
        while not stop.is_set():
            value = b"%06d-" % i + b"x" * 8000         # fetches of many such batches: written in threads
            p.produce("fence", value=value, partition=0,
                      on_delivery=lambda err, msg: err is None and acked.append(msg.value()[:6]))
            p.poll(0)
            i += 1
            if len(p) > 400:
                p.flush(1)
        assert p.flush(60) == 0
    writer = threading.Thread(target=produce)
    writer.start()
    try:
        until(lambda: len(acked) > 300, "records acknowledged")
        cluster.brokers[follower].kill()               # mid-fetch, with a write in a thread, maybe
        cluster.brokers[follower].restart()            # catches up with large fetches...
        cluster.brokers[leader].kill()                 # ...while its leader dies: a role change
        until(lambda: partitions(cluster, "fence")[0][0] not in (leader, -1), "a new leader")
        n = len(acked)
        until(lambda: len(acked) > n + 200, "acks again under the new leader")
        cluster.brokers[follower].kill()
        cluster.brokers[leader].restart()              # the old leader truncates and follows
        cluster.brokers[follower].restart()
        n = len(acked)
        until(lambda: len(acked) > n + 200, "acks with everyone back")
    finally:
        stop.set()
        writer.join(90)
    wait_brokers(cluster, {0, 1, 2})
    until(lambda: len(partitions(cluster, "fence")[0][3]) == 3, "all three back in the ISR")
    hw = high_watermark(cluster, "fence")
    now_leader = partitions(cluster, "fence")[0][0]
    files = log_files(cluster, "fence")
    committed = below(files[now_leader], hw)
    assert committed and list(iter_batches(committed))[-1][1].next_offset == hw
    for b, data in enumerate(files):
        assert data[:len(committed)] == committed, f"broker {b}'s files differ from the leader's below the HW"
    got = read_values(cluster.bootstrap, "fence", 1, "read_uncommitted", idle_s=2.0, want=len(acked))
    ids = [v[:6] for v in got]
    assert len(ids) == len(set(ids)) and set(ids) >= {a.decode() for a in acked}
