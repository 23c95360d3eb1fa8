"""Transactions across brokers on a real local cluster (etcd and three broker processes).

Partitions of one transaction are led by all three brokers; the transaction
coordinator writes each marker through the partition's current leader
(WriteTxnMarkers between brokers), and leaders that are not the coordinator accept
the transaction's produce under producer-state rules.

- a confluent-kafka consume-transform-produce copy, RF3 input to RF3 output, with
  aborted transactions in between: output == input exactly once (read_committed),
  the aborted records are in every partition yet invisible, and every partition's
  LSO reaches its high watermark;
- the eos runtime (semel.eos) committing cycles against the cluster.
"""
from __future__ import annotations

import threading

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from semel.client.client import Client
from semel.eos import EosRuntime
from semel.eos.kafka import KafkaTxnBackend
from semel.eos.sinks.memory import MemorySink, MemorySinkState
from tests.support.cluster import fill, key_leader, module_cluster, partitions, wait_brokers
from tests.support.consume import read_values
from tests.support.markers import starts_processes
from tests.support.wait import in_background, until

PARTS = 3
N = 300


@pytest.fixture(scope="module")
@starts_processes
def cluster(tmp_path_factory):
    with module_cluster(tmp_path_factory, "cluster-txn", 3, 6, "--group-initial-rebalance-delay-ms", "0") as c:
        yield c


def create(cluster, *topics: str) -> None:
    """RF3 topics whose partitions are led by all three brokers, each with a full ISR."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    futures = admin.create_topics([NewTopic(t, PARTS, 3, config={"min.insync.replicas": "2"}) for t in topics])
    for f in futures.values():
        f.result(30)
    for t in topics:
        until(lambda t=t: all(len(isr) == 3 for _, _, _, isr in partitions(cluster, t).values()),
              f"{t}: leaders and full ISRs")
        assert {leader for leader, *_ in partitions(cluster, t).values()} == {0, 1, 2}


def offsets_by_leader(cluster, topic: str, isolation: int) -> dict[int, int]:
    """Each partition's end offset as its leader reports it (0: high watermark, 1: LSO)."""
    out = {}
    for p, (leader, *_rest) in partitions(cluster, topic).items():
        with Client(cluster.brokers[leader].bootstrap, timeout_s=10) as c:
            out[p] = c.list_offset(topic, p, -1, isolation)
    return out


def copy(cluster, src: str, dst: str, txn_id: str, abort_every: int, on_commit=lambda copied: None) -> int:
    """Copy src to dst in transactions (offsets committed in them); every `abort_every`-th
    transaction also writes 'aborted-*' records to every dst partition and aborts.
    Returns how many transactions were aborted; on_commit(records copied so far) after each commit."""
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"g-{txn_id}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": txn_id,
                         "transaction.timeout.ms": 60000})
    producer.init_transactions(30)
    consumer.subscribe([src])
    copied = aborted = rounds = 0
    try:
        while copied < N:
            msgs = [m for m in consumer.consume(40, 1.0) if not m.error()]
            if not msgs:
                continue
            rounds += 1
            producer.begin_transaction()
            if rounds % abort_every == 0:
                for p in range(PARTS):
                    producer.produce(dst, value=f"aborted-{rounds}-{p}".encode(), partition=p)
                producer.flush(60)
                producer.abort_transaction(60)
                aborted += 1
                _rewind(consumer, msgs)      # the next transaction copies these records
                continue
            for m in msgs:
                producer.produce(dst, value=m.value(), partition=m.partition())
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 60)
            producer.commit_transaction(60)
            copied += len(msgs)
            on_commit(copied)
    finally:
        consumer.close()
    return aborted


def _rewind(consumer, msgs) -> None:
    """Back to the first record of each partition in msgs (what the aborted transaction consumed)."""
    first: dict[tuple[str, int], int] = {}
    for m in msgs:
        first.setdefault((m.topic(), m.partition()), m.offset())
    for (t, p), off in first.items():
        consumer.seek(TopicPartition(t, p, off))


def test_consume_transform_produce_across_three_leaders_exactly_once(cluster):
    create(cluster, "ctp-in", "ctp-out")
    values = fill(cluster, "ctp-in", N, PARTS)
    aborted = copy(cluster, "ctp-in", "ctp-out", "ctp-copy", abort_every=3)
    assert aborted >= 1
    got = read_values(cluster.bootstrap, "ctp-out", PARTS, "read_committed", want=N)
    assert sorted(got) == values                         # exactly once, no aborted record
    raw = read_values(cluster.bootstrap, "ctp-out", PARTS, "read_uncommitted", want=N + aborted * PARTS)
    # The aborted transactions' records reached every partition (and its leader hid them).
    assert {v.rsplit("-", 1)[1] for v in raw if v.startswith("aborted-")} == {str(p) for p in range(PARTS)}
    # Every partition's LSO caught up with its high watermark: all markers were written.
    until(lambda: offsets_by_leader(cluster, "ctp-out", 1) == offsets_by_leader(cluster, "ctp-out", 0),
          "LSO == high watermark on every leader")
    assert all(v > 0 for v in offsets_by_leader(cluster, "ctp-out", 1).values())


def test_a_partition_leader_sigkilled_mid_copy_keeps_it_exact(cluster):
    """Kafka's transactions test with a hard bounce of a partition leader (not the
    coordinator's broker): produce retries reach the new leader, markers of the
    transactions under way are written once it is elected, the copy goes on exactly."""
    create(cluster, "bounce-in", "bounce-out")
    values = fill(cluster, "bounce-in", N, PARTS)
    # The copy's coordinators: the leaders of its ids' internal partitions (created by now).
    coordinators = {key_leader(cluster, "__transaction_state", "bounce-copy"),
                    key_leader(cluster, "__consumer_offsets", "g-bounce-copy")}
    victim = next(leader for leader, *_ in partitions(cluster, "bounce-out").values() if leader not in coordinators)
    third = threading.Event()
    worker, errors = in_background(lambda: copy(cluster, "bounce-in", "bounce-out", "bounce-copy", abort_every=4,
                                                on_commit=lambda n: n >= N // 3 and third.set()), third)
    assert third.wait(120)
    cluster.brokers[victim].kill()
    worker.join(300)
    assert not worker.is_alive() and errors == []
    assert victim not in {leader for leader, *_ in partitions(cluster, "bounce-out").values()}   # failed over
    cluster.brokers[victim].restart()
    wait_brokers(cluster, {0, 1, 2})
    got = read_values(cluster.bootstrap, "bounce-out", PARTS, "read_committed", want=N)
    assert sorted(got) == values
    until(lambda: all(len(isr) == 3 for _, _, _, isr in partitions(cluster, "bounce-out").values()),
          "the bounced broker back in every ISR")
    until(lambda: offsets_by_leader(cluster, "bounce-out", 1) == offsets_by_leader(cluster, "bounce-out", 0),
          "LSO == high watermark on every leader")


def test_eos_runtime_commits_against_the_cluster(cluster):
    create(cluster, "eos-in", "eos-out")
    values = fill(cluster, "eos-in", N, PARTS)
    coord = KafkaTxnBackend(cluster.bootstrap, "eos_app-0", [("eos-in", p) for p in range(PARTS)], timeout=30)
    state = MemorySinkState()
    rt = EosRuntime("eos_app", "0", coord, [MemorySink("m", state)], commit_interval=0.3)
    rt.start()

    def process(rec, ctx):
        ctx.send("eos-out", rec.value)
        ctx.stage("m", rec.value.decode())
    try:
        for _ in range(60):
            if len(state.committed_rows()) >= N:
                break
            rt.run(process, max_cycles=1)
    finally:
        rt.close()
    assert sorted(state.committed_rows()) == values
    assert sorted(read_values(cluster.bootstrap, "eos-out", PARTS, "read_committed", want=N)) == values
