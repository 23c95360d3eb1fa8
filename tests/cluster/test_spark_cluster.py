"""The Spark sink on a 3-broker cluster.

A streaming query semel source -> transform -> semel sink over RF3 topics runs
unchanged against the cluster, in both sink modes (atomic batches, semel.atomicBatches
=true, and per-task branches, false): the sink routes each request as a Kafka producer
does (semel.client.cluster.ClusterRouter): transaction requests to the transactional id's
coordinator, TxnOffsetCommit and the decision read to the group's, Produce to each
partition's leader. The output, read by confluent-kafka read_committed, is the input
exactly once, also after a second run from the same checkpoint.

A parent transaction and its branches must share one coordinator; with several
__transaction_state partitions the sink names every branch so that it hashes exactly
like its parent (semel.protocol.txn_hash.aligned), and the coordinator refuses a branch
of another partition. Real broker processes (3, default partition counts), one Spark
local[2] session for the module.

A leader of an output partition SIGKILLed between two runs of the query: the second
run's sink finds the partition's new leader (its pooled routing drops the broker it can
no longer reach) and the output is still exactly the input once. Coordinator moves
while a request is in flight are checked on a model (tests/spark/test_router_model.py)."""
from __future__ import annotations

import random
import threading

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from semel.client import txn as wire
from semel.client.client import Client
from semel.coordinator.txn import TXN_TOPIC
from semel.protocol.errors import KafkaError
from semel.protocol.txn_hash import aligned, java_string_hash, partition_for
from semel.spark import atomic, sink
from tests.support.cluster import committed, fill, key_leader, module_cluster, partitions, wait_brokers
from tests.support.consume import read_values
from tests.support.markers import starts_processes
from tests.support.wait import until

E = KafkaError


def _random_id(rng: random.Random) -> str:
    pools = [(0x20, 0x7E), (0xA0, 0x2FFF), (0x4E00, 0x9FFF), (0x10000, 0x1FFFF)]   # ASCII, Latin..CJK, astral
    return "".join(chr(rng.randint(*rng.choice(pools))) for _ in range(rng.randint(0, 40)))


def test_aligned_ids_hash_like_their_parent_for_every_partition_count():
    rng = random.Random(13)
    for _ in range(500):
        parent, name = _random_id(rng), _random_id(rng)
        branch = aligned(parent, name)
        assert branch.startswith(name) and len(branch) == len(name) + 7
        assert java_string_hash(branch) == java_string_hash(parent)
        assert [partition_for(branch, n) for n in range(1, 65)] == [partition_for(parent, n) for n in range(1, 65)]
        assert aligned(parent, name) == branch    # deterministic: the same id after a restart


def test_sink_branch_ids_are_aligned_and_distinct():
    o = sink.parse_options({"kafka.bootstrap.servers": "x:1", "semel.query.id": "q\u00e9", "topic": "t"})
    ids = {sink.branch_id(o, b, p, a) for b in range(3) for p in range(4) for a in range(2)}
    assert len(ids) == 24
    assert {java_string_hash(i) for i in ids} == {java_string_hash(o.parent)}


@pytest.fixture(scope="module")
@starts_processes
def cluster(tmp_path_factory):
    with module_cluster(tmp_path_factory, "spark-cluster", 3, 6, "--group-initial-rebalance-delay-ms", "0") as c:
        yield c


def coordinator_bootstrap(cluster, txn_id: str) -> str:
    """The bootstrap of `txn_id`'s transaction coordinator (FindCoordinator creates
    __transaction_state on first use)."""
    def found():
        with cluster.connect(cluster.brokers[0].bootstrap) as c:
            r = c.request(10, key=txn_id, key_type=1)
        return cluster.brokers[r.node_id].bootstrap if r.error_code == 0 else None
    return until(found, f"a coordinator of {txn_id}")


def test_a_branch_of_another_partition_is_refused_an_aligned_one_is_joined(cluster):
    parent = "sc-parent"
    bootstrap = coordinator_bootstrap(cluster, parent)
    n = len(partitions(cluster, TXN_TOPIC))
    assert n > 1
    stray = next(f"sc-stray{i}" for i in range(100) if partition_for(f"sc-stray{i}", n) != partition_for(parent, n))
    branch = atomic.branch_name(parent, "sc-branch")
    create(cluster, "sc-join", 1)
    with cluster.connect(bootstrap) as c:
        err, b = wire.init_producer_id(c, branch, 60_000)    # the branch's coordinator is the parent's
        assert err == E.NONE
        err, p = wire.init_producer_id(c, parent, 60_000)
        assert err == E.NONE
        got = wire.add_partitions(c, p, [atomic.pseudo_partition(stray), atomic.pseudo_partition(branch)])
        # the stray is refused as a Kafka broker refuses the pseudo-topic; the aligned one
        # reaches the extension's own check (an empty branch is not ongoing)
        assert got == {atomic.pseudo_partition(stray): E.INVALID_TOPIC_EXCEPTION,
                       atomic.pseudo_partition(branch): E.INVALID_TXN_STATE}
        assert wire.add_partitions(c, b, [("sc-join", 0)]) == {("sc-join", 0): E.NONE}   # now ongoing
        assert wire.add_partitions(c, p, [atomic.pseudo_partition(branch)]) == {
            atomic.pseudo_partition(branch): E.NONE}
        assert wire.end_txn(c, parent, p.pid, p.epoch, False) == E.NONE   # the abort ends the branch too
        assert wire.end_txn(c, branch, b.pid, b.epoch, True) != E.NONE


def create(cluster, topic: str, parts: int) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for f in admin.create_topics([NewTopic(topic, parts, 3, config={"min.insync.replicas": "2"})]).values():
        f.result(timeout=60)


def test_the_sinks_probe_finds_the_extension_on_its_coordinator(cluster):
    """The probe's branch is aligned too, so semel.atomicBatches=auto resolves to mode (a)
    on a cluster as on a single node (it was refused as INVALID_TOPIC_EXCEPTION before)."""
    probe = "semel-spark-sc.probe"
    with cluster.connect(coordinator_bootstrap(cluster, probe)) as c:
        assert atomic.resolve("auto", c, probe, 60_000)


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """One local[2] session for this module (as tests/spark/conftest.py's, which this
    directory does not see)."""
    from semel.spark import local_session
    session = local_session("local[2]", "semel-cluster-tests", tmp_path_factory.mktemp("spark-local"))
    yield session
    session.stop()


def run_query(spark, cluster, src: str, dst: str, checkpoint, mode: str) -> None:
    """source -> transform -> sink, availableNow, several micro-batches (30 rows each)."""
    df = (spark.readStream.format("semel").option("kafka.bootstrap.servers", cluster.bootstrap)
          .option("subscribe", src).option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "30").load())
    q = (df.selectExpr("key", "concat('out-', cast(value as string)) as value").writeStream.format("semel")
         .option("kafka.bootstrap.servers", cluster.bootstrap).option("topic", dst)
         .option("checkpointLocation", str(checkpoint)).option("semel.atomicBatches", mode)
         .trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None


def produce_more(cluster, topic: str, values: list[str], parts: int) -> None:
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True})
    for i, v in enumerate(values):
        p.produce(topic, value=v.encode(), partition=i % parts)
    assert p.flush(60) == 0


@pytest.mark.parametrize("mode", ["true", "false"])
def test_a_streaming_query_writes_exactly_once_on_the_cluster(spark, cluster, tmp_path, mode):
    src, dst = f"scq-in-{mode}", f"scq-out-{mode}"
    create(cluster, src, 3)
    create(cluster, dst, 3)
    # the output's leaders are spread: Produce must go to more than one broker
    assert len({leader for leader, *_ in partitions(cluster, dst).values()}) > 1
    first = fill(cluster, src, 90, 3)
    run_query(spark, cluster, src, dst, tmp_path / "ck", mode)
    more = [f"w{i:04d}" for i in range(45)]
    produce_more(cluster, src, more, 3)
    run_query(spark, cluster, src, dst, tmp_path / "ck", mode)   # the same checkpoint: only the new rows
    got = read_values(cluster.bootstrap, dst, 3, want=135)
    assert sorted(got) == sorted(f"out-{v}" for v in first + more)
    # the batches' decisions: the source end offsets, committed on the group's coordinator
    from confluent_kafka import TopicPartition
    group = sink.parse_options({"kafka.bootstrap.servers": cluster.bootstrap,
                                "checkpointLocation": str(tmp_path / "ck")}).group
    assert committed(cluster, group, [TopicPartition(src, p) for p in range(3)]) == {0: 45, 1: 45, 2: 45}


def test_an_output_leader_sigkilled_between_two_runs_keeps_it_exact(spark, cluster, tmp_path):
    src, dst = "sck-in", "sck-out"
    create(cluster, src, 3)
    create(cluster, dst, 3)
    first = fill(cluster, src, 60, 3)
    run_query(spark, cluster, src, dst, tmp_path / "ck", "true")
    group = sink.parse_options({"kafka.bootstrap.servers": cluster.bootstrap,
                                "checkpointLocation": str(tmp_path / "ck")}).group
    txn_coordinator = key_leader(cluster, TXN_TOPIC, f"semel-spark-{group}")
    coordinators = {txn_coordinator, key_leader(cluster, "__consumer_offsets", group)}
    leaders = [leader for leader, *_ in partitions(cluster, dst).values()]
    victim = next((n for n in leaders if n not in coordinators), None)
    if victim is None:   # every output leader coordinates too: take one that is not the parent's
        victim = next(n for n in leaders if n != txn_coordinator)
    cluster.brokers[victim].kill()
    try:
        until(lambda: victim not in {leader for leader, *_ in partitions(cluster, dst).values()},
              f"the output's partitions led by others than broker {victim}")
        more = [f"k{i:04d}" for i in range(45)]
        produce_more(cluster, src, more, 3)
        run_query(spark, cluster, src, dst, tmp_path / "ck", "true")
        got = read_values(cluster.bootstrap, dst, 3, want=105)
        assert sorted(got) == sorted(f"out-{v}" for v in first + more)
    finally:
        cluster.brokers[victim].restart()
        wait_brokers(cluster, {0, 1, 2})



class StablePoller(threading.Thread):
    """A read_committed poller of one partition at its leader: the last stable offset
    (the end a read_committed fetch stops at), asked for in a tight loop while batches
    commit; every distinct value it saw."""

    def __init__(self, bootstrap: str, topic: str, partition: int):
        super().__init__(daemon=True)
        self.args, self.seen, self.stop = (bootstrap, topic, partition), set(), threading.Event()

    def run(self) -> None:
        bootstrap, topic, partition = self.args
        with Client(bootstrap, timeout_s=10) as c:
            while not self.stop.is_set():
                self.seen.add(c.list_offset(topic, partition, -1, 1))


def batch_ranges(bootstrap: str, topic: str, partition: int) -> dict[int, tuple[int, int]]:
    """batch -> (first, last) offset of its rows in the partition (read_uncommitted)."""
    from confluent_kafka import Consumer, KafkaError as KE, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "ranges", "isolation.level": "read_uncommitted",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    out: dict[int, tuple[int, int]] = {}
    try:
        c.assign([TopicPartition(topic, partition, 0)])
        while True:
            m = c.poll(5)
            assert m is not None, "no end of partition"
            if m.error():
                assert m.error().code() == KE._PARTITION_EOF
                return out
            b = int(m.value().decode().split(":")[0])
            first, _ = out.get(b, (m.offset(), m.offset()))
            out[b] = (first, m.offset())
    finally:
        c.close()


def test_a_read_committed_poller_never_sees_part_of_a_batch_on_the_cluster(cluster):
    """Mode (a) on 3 brokers, the output's partitions led by all three: each batch is 8
    tasks' branches, every task writing to every partition, decided by the sink's
    commit (the parent's coordinator sends each leader one WriteTxnMarkers carrying
    every branch, and the leader appends a partition's markers at once). Pollers ask each
    partition's leader for its last stable offset in a tight loop: none ever falls inside
    a batch's rows there. An unmodified confluent-kafka read_committed consumer polls all
    the while; it never holds part of a batch once it read past it, never gets a row late
    or twice, and ends with all."""
    from semel.spark import branch_writer
    from semel.spark import decision as spark_decision
    from tests.spark.test_sink_atomic import LiveReader, partial_batches
    dst = "scq-poll"
    create(cluster, dst, 3)
    assert {leader for leader, *_ in partitions(cluster, dst).values()} == {0, 1, 2}
    o = sink.probe(sink.parse_options({"kafka.bootstrap.servers": cluster.bootstrap, "semel.query.id": "poll",
                                       "topic": dst, "semel.atomicBatches": "true"}))
    assert o.atomic
    reader = LiveReader(cluster.bootstrap, dst, 3)
    reader.start()
    leaders = {p: cluster.brokers[leader].bootstrap for p, (leader, *_) in partitions(cluster, dst).items()}
    pollers = [StablePoller(leaders[p], dst, p) for p in range(3)]
    for poller in pollers:
        poller.start()
    expected: dict[int, set] = {}
    batches, tasks = 12, 8
    for b in range(batches):
        msgs = []
        for t in range(tasks):
            rows = [(f"{b}:{t}:{p}:{i}".encode(), p) for p in range(3) for i in range(2)]
            expected.setdefault(b, set()).update(v.decode() for v, _ in rows)
            msgs.append(branch_writer.write_branch(o, {"value": 0, "partition": 1}, iter(rows), b, t, 0))
        spark_decision.commit_batch(o, msgs, b)
    for poller in pollers:
        poller.stop.set()
        poller.join(30)
    total = sum(len(v) for v in expected.values())
    # No last stable offset any poller saw lies inside a batch's rows of its partition
    # (some of them below it, visible, and some above).
    for p, poller in enumerate(pollers):
        ranges = batch_ranges(cluster.bootstrap, dst, p)
        assert len(ranges) == batches and len(poller.seen) > batches
        inside = sorted((b, lso) for lso in poller.seen for b, (first, last) in ranges.items() if first < lso <= last)
        assert inside == [], f"partition {p}: part of a batch visible (batch, LSO): {inside[:5]}"
    reader.finish(total, 120)
    assert len(reader.history) == total, "the reader did not get every row"
    observed = [(q, int(v.split(":")[0]), v) for q, v, _ in reader.history]
    assert partial_batches(observed, expected, 3) == []
