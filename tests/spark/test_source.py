"""format("semel") as a Spark source, against real semel broker processes (and Tansu),
read by a real local[2] Spark; records written by unmodified confluent-kafka clients."""
from __future__ import annotations

import json
import threading
from contextlib import contextmanager

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from semel.launch.process import free_port
from semel.spark.source import KAFKA_SCHEMA, KAFKA_SCHEMA_WITH_HEADERS
from tests.spark.conftest import FAST_GROUPS
from tests.support.brokers import module_broker
from tests.support import wait


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """This module's broker: retention checked often, for the data-loss test."""
    with module_broker(tmp_path_factory, "source-broker", *FAST_GROUPS, "--retention-check-interval-ms", "200") as b:
        yield b


def create(bootstrap: str, topic: str, partitions: int = 1, config: dict | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})]).values():
        f.result(timeout=30)


def produce(bootstrap: str, topic: str, values, partition: int = 0, headers=None) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i, v in enumerate(values):
        p.produce(topic, value=v.encode(), key=f"k{i}".encode(), partition=partition, headers=headers)
    assert p.flush(30) == 0


def transaction(bootstrap: str, txn_id: str, topic: str, values, commit: bool, partition: int = 0) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    p.init_transactions(30)
    p.begin_transaction()
    for v in values:
        p.produce(topic, value=v.encode(), partition=partition)
    p.flush(30)  # on the broker before the decision, so an abort leaves records in the log
    if commit:
        p.commit_transaction(30)
    else:
        p.abort_transaction(30)


def reader(spark, bootstrap: str, stream: bool = False, **options):
    r = (spark.readStream if stream else spark.read).format("semel")
    r = r.option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def values(df) -> list[str]:
    return [r.value.decode() for r in df.orderBy("partition", "offset").collect()]


def run_available_now(df, progress: list | None = None) -> list:
    """Run a stream with Trigger.AvailableNow through foreachBatch; the rows of each batch.
    progress, when given, receives the query's last progress report."""
    got: list = []

    def collect(batch_df, batch_id):
        got.append((batch_id, [(r.topic, r.partition, r.offset, r.value.decode())
                               for r in batch_df.collect()]))

    q = df.writeStream.foreachBatch(collect).trigger(availableNow=True).start()
    assert q.awaitTermination(180), "availableNow query did not finish"
    assert q.exception() is None
    if progress is not None:
        progress.append(q.lastProgress)
    return got


@contextmanager
def running(df, checkpoint):
    """A query collecting the values it reads (foreachBatch, 200 ms triggers), stopped at the end."""
    seen: list[str] = []
    lock = threading.Lock()

    def collect(batch_df, batch_id):
        got = [r.value.decode() for r in batch_df.collect()]
        with lock:
            seen.extend(got)

    q = (df.writeStream.foreachBatch(collect).trigger(processingTime="200 milliseconds")
         .option("checkpointLocation", str(checkpoint)).start())
    try:
        yield q, seen
    finally:
        q.stop()


def fails(q, match: str) -> None:
    """The query ends by itself with an error matching `match` (a liveness bound, not a timing)."""
    with pytest.raises(Exception, match=match):
        assert q.awaitTermination(120), "query neither failed nor stopped"
        raise AssertionError(f"query ended without an error: {q.exception()}")


# --- batch reads -----------------------------------------------------------------------

def test_batch_read_schema_and_offset_ranges(spark, broker):
    bs = broker.bootstrap
    create(bs, "b-range", 2)
    produce(bs, "b-range", [f"p0-{i}" for i in range(10)], partition=0, headers=[("src", b"test")])
    produce(bs, "b-range", [f"p1-{i}" for i in range(6)], partition=1)

    df = reader(spark, bs, subscribe="b-range")
    assert df.schema == KAFKA_SCHEMA
    rows = df.orderBy("partition", "offset").collect()
    assert [r.value.decode() for r in rows] == [f"p0-{i}" for i in range(10)] + [f"p1-{i}" for i in range(6)]
    first = rows[0]
    assert (first.key, first.topic, first.partition, first.offset, first.timestampType) == \
        (b"k0", "b-range", 0, 0, 0)
    assert first.timestamp.year >= 2024

    ranged = reader(spark, bs, subscribe="b-range",
                    startingOffsets=json.dumps({"b-range": {"0": 3, "1": -2}}),
                    endingOffsets=json.dumps({"b-range": {"0": 7, "1": -1}}))
    assert values(ranged) == [f"p0-{i}" for i in range(3, 7)] + [f"p1-{i}" for i in range(6)]
    # One Spark partition per Kafka partition range.
    assert ranged.rdd.getNumPartitions() == 2
    assert values(reader(spark, bs, assign=json.dumps({"b-range": [1]}))) == [f"p1-{i}" for i in range(6)]
    split = reader(spark, bs, subscribe="b-range", minPartitions="5")
    assert split.rdd.getNumPartitions() == 5
    assert values(split) == [f"p0-{i}" for i in range(10)] + [f"p1-{i}" for i in range(6)]

    with_headers = reader(spark, bs, subscribe="b-range", includeHeaders="true",
                          endingOffsets=json.dumps({"b-range": {"0": 1, "1": 1}}))
    assert with_headers.schema == KAFKA_SCHEMA_WITH_HEADERS
    hs = {r.partition: r.headers for r in with_headers.collect()}
    assert [(h.key, h.value) for h in hs[0]] == [("src", b"test")]
    assert hs[1] is None  # no headers: null, as in Spark's Kafka source


def test_read_committed_hides_aborted_and_control_records_and_rereads_identically(spark, broker):
    bs = broker.bootstrap
    create(bs, "b-txn", 1)
    transaction(bs, "src-txn", "b-txn", ["c1", "c2", "c3"], commit=True)
    transaction(bs, "src-txn", "b-txn", ["x1", "x2"], commit=False)
    produce(bs, "b-txn", ["plain"])
    transaction(bs, "src-txn", "b-txn", ["c4"], commit=True)

    committed = reader(spark, bs, subscribe="b-txn")
    rows = [(r.offset, r.value.decode()) for r in committed.orderBy("offset").collect()]
    assert [v for _, v in rows] == ["c1", "c2", "c3", "plain", "c4"]
    # Offsets 3 (commit marker), 4-5 (aborted), 6 (abort marker) never show up.
    assert [o for o, _ in rows] == [0, 1, 2, 7, 8]

    uncommitted = reader(spark, bs, subscribe="b-txn", **{"kafka.isolation.level": "read_uncommitted"})
    assert values(uncommitted) == ["c1", "c2", "c3", "x1", "x2", "plain", "c4"]

    # A range whose ends sit on markers and aborted records: same rows every time.
    sub = json.dumps({"b-txn": {"0": 2}}), json.dumps({"b-txn": {"0": 7}})
    reads = [[tuple(r) for r in reader(spark, bs, subscribe="b-txn", startingOffsets=sub[0],
                                        endingOffsets=sub[1]).orderBy("offset").collect()]
             for _ in range(2)]
    assert [r[1].decode() for r in reads[0]] == ["c3"]
    assert reads[0] == reads[1]


def test_open_transaction_bounds_the_read_at_the_last_stable_offset(spark, broker):
    bs = broker.bootstrap
    create(bs, "b-open", 1)
    produce(bs, "b-open", ["before"])
    p = Producer({"bootstrap.servers": bs, "transactional.id": "open-txn"})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("b-open", value=b"pending")
    p.flush(30)
    produce(bs, "b-open", ["after"])  # above the LSO until the transaction ends
    try:
        assert values(reader(spark, bs, subscribe="b-open")) == ["before"]
        assert values(reader(spark, bs, subscribe="b-open",
                             **{"kafka.isolation.level": "read_uncommitted"})) == ["before", "pending", "after"]
    finally:
        p.commit_transaction(30)
    assert values(reader(spark, bs, subscribe="b-open")) == ["before", "pending", "after"]


# --- streaming reads ---------------------------------------------------------------------

def test_stream_available_now_with_admission_control(spark, broker):
    bs = broker.bootstrap
    create(bs, "s-admit", 2)
    produce(bs, "s-admit", [f"a{i}" for i in range(30)], partition=0)
    produce(bs, "s-admit", [f"b{i}" for i in range(20)], partition=1)

    df = reader(spark, bs, stream=True, subscribe="s-admit", startingOffsets="earliest",
                maxOffsetsPerTrigger="20")
    progress: list = []
    batches = [b for b in run_available_now(df, progress) if b[1]]
    rows = [r for _, rs in batches for r in rs]
    assert sorted(r[3] for r in rows) == sorted([f"a{i}" for i in range(30)] + [f"b{i}" for i in range(20)])
    assert len(rows) == len(set(rows)) == 50
    assert len(batches) >= 3 and all(len(rs) <= 20 for _, rs in batches)
    # The query's progress shows what the source saw at the end (reportLatestOffset).
    source = progress[0]["sources"][0]
    assert json.loads(source["latestOffset"]) == {"s-admit": {"0": 30, "1": 20}}

    # The wording, maxRecordsPerTrigger, is the same limit.
    df = reader(spark, bs, stream=True, subscribe="s-admit", startingOffsets="earliest",
                maxRecordsPerTrigger="25")
    batches = [b for b in run_available_now(df) if b[1]]
    assert [len(rs) for _, rs in batches] == [25, 25]


def test_stream_starting_offsets_latest_json_and_committed(spark, broker):
    bs = broker.bootstrap
    create(bs, "s-start", 1)
    produce(bs, "s-start", [f"v{i}" for i in range(8)])

    latest = run_available_now(reader(spark, bs, stream=True, subscribe="s-start"))
    assert [r for _, rs in latest for r in rs] == []  # default: latest

    given = run_available_now(reader(spark, bs, stream=True, subscribe="s-start",
                                     startingOffsets=json.dumps({"s-start": {"0": 5}})))
    assert [r[3] for _, rs in given for r in rs] == ["v5", "v6", "v7"]

    # What a query's batches committed on the broker (as the sink does, in its transaction).
    c = Consumer({"bootstrap.servers": bs, "group.id": "query-group", "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition("s-start", 0, 6)], asynchronous=False)
    c.close()
    resumed = run_available_now(reader(spark, bs, stream=True, subscribe="s-start",
                                       startingOffsets="committed", **{"kafka.group.id": "query-group"}))
    assert [r[3] for _, rs in resumed for r in rs] == ["v6", "v7"]


def test_committed_start_waits_for_the_transaction_that_commits_the_offsets(broker):
    """The sink commits a batch's source offsets inside the batch's transaction: while
    that transaction is open the committed position is unknown (UNSTABLE_OFFSET_COMMIT),
    so the source retries (bounded) rather than start from a stale position."""
    from semel.client import Client
    from semel.client.cluster import ClusterRouter, ReaderError
    from tests.support.txn import RawTxn
    bs = broker.bootstrap
    create(bs, "s-pending", 1)
    tp = ("s-pending", 0)
    raw = RawTxn(Client(bs), "pending-offsets")
    try:
        assert raw.init() == 0
        assert raw.add_offsets("pending-group") == 0
        assert raw.commit_offsets("pending-group", {tp: 4}) == {tp: 0}
        with ClusterRouter(bs, timeout_s=1) as cluster:
            with pytest.raises(ReaderError, match="UNSTABLE_OFFSET_COMMIT"):
                cluster.committed("pending-group", [tp])
            assert raw.end(commit=True) == 0
            assert cluster.committed("pending-group", [tp]) == {tp: 4}
    finally:
        raw.c.close()


def test_stream_picks_up_new_partitions_of_a_pattern(spark, broker, tmp_path):
    bs = broker.bootstrap
    create(bs, "pat-a", 1)
    produce(bs, "pat-a", ["a0", "a1"])
    df = reader(spark, bs, stream=True, subscribePattern="pat-.*", startingOffsets="earliest")
    with running(df, tmp_path / "ckpt") as (q, seen):
        wait.until(lambda: len(seen) >= 2, "first topic read", timeout_s=120)
        # Partitions that appear while the query runs are read from their earliest offset.
        create(bs, "pat-b", 2)
        produce(bs, "pat-b", ["b0"], partition=0)
        produce(bs, "pat-b", ["b1"], partition=1)
        produce(bs, "pat-a", ["a2"])
        wait.until(lambda: len(seen) >= 5 or q.exception(), "new topic's partitions read", timeout_s=120)
        assert q.exception() is None
    assert sorted(seen) == ["a0", "a1", "a2", "b0", "b1"]


def test_fail_on_data_loss(spark, broker):
    bs = broker.bootstrap
    create(bs, "s-loss", 1, {"segment.bytes": "200", "retention.bytes": "200"})
    for i in range(6):
        produce(bs, "s-loss", [f"r{i}" * 20])
    from semel.client.cluster import EARLIEST, ClusterRouter
    with ClusterRouter(bs) as cluster:
        start = wait.until(lambda: cluster.list_offsets([("s-loss", 0)], EARLIEST, True)[("s-loss", 0)],
                           "retention to delete the first segments")
    below = json.dumps({"s-loss": {"0": 0}})
    with pytest.raises(Exception, match="failOnDataLoss"):
        reader(spark, bs, subscribe="s-loss", startingOffsets=below).collect()
    rest = reader(spark, bs, subscribe="s-loss", startingOffsets=below, failOnDataLoss="false")
    offsets = [r.offset for r in rest.orderBy("offset").collect()]
    assert offsets and offsets[0] >= start and offsets == sorted(set(offsets))


def test_topic_recreated_under_a_running_query_is_data_loss(spark, broker, tmp_path):
    bs = broker.bootstrap
    create(bs, "s-recreate", 1)
    produce(bs, "s-recreate", ["r1", "r2", "r3"])
    df = reader(spark, bs, stream=True, subscribe="s-recreate", startingOffsets="earliest")
    with running(df, tmp_path / "ckpt") as (q, seen):
        wait.until(lambda: len(seen) >= 3, "records of the first topic", timeout_s=120)
        admin = AdminClient({"bootstrap.servers": bs})
        for f in admin.delete_topics(["s-recreate"]).values():
            f.result(timeout=30)
        wait.until(lambda: "s-recreate" not in admin.list_topics(timeout=10).topics, "topic deleted")
        create(bs, "s-recreate", 1)
        produce(bs, "s-recreate", ["new"])
        fails(q, "the log went back")
    assert seen == ["r1", "r2", "r3"]


# --- bad input: a clear error at start, never a hang --------------------------------------

@pytest.mark.parametrize("options, message", [
    ({"subscribe": "x", "startingOffset": "earliest"}, "unknown source option"),
    ({"subscribe": "x", "startingOffsets": "{not json"}, "not valid JSON"),
    ({"subscribe": "x", "startingOffsets": "yesterday"}, "must be one of earliest, latest"),
    ({"subscribe": "x", "subscribePattern": "x.*"}, "exactly one of"),
    ({"subscribe": "x", "maxOffsetsPerTrigger": "-3"}, "must be positive"),
    ({"subscribe": "x", "kafka.isolation.level": "dirty"}, "read_committed or read_uncommitted"),
])
def test_malformed_options_fail_at_start(spark, broker, options, message):
    with pytest.raises(Exception, match=message):
        reader(spark, broker.bootstrap, **options).collect()


def test_unknown_topic_fails_a_batch_read(spark, broker):
    # A stream waits for it instead (tests/spark/test_compat.py).
    with pytest.raises(Exception, match="unknown topic or partition: no-such-topic"):
        reader(spark, broker.bootstrap, subscribe="no-such-topic").collect()


def test_unreachable_broker_fails_with_bounded_retries(spark):
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(Exception, match="cannot reach the brokers"):
        reader(spark, dead, subscribe="t", **{"kafka.request.timeout.ms": "1500"}).collect()


def test_broker_restart_within_the_retry_bound_is_survived_and_an_outage_is_not(
        spark, start_broker, tmp_path):
    b = start_broker("--group-initial-rebalance-delay-ms", "0")
    create(b.bootstrap, "s-outage", 1)
    produce(b.bootstrap, "s-outage", ["o1", "o2"])
    df = reader(spark, b.bootstrap, stream=True, subscribe="s-outage", startingOffsets="earliest",
                **{"kafka.request.timeout.ms": "20000"})
    with running(df, tmp_path / "ckpt1") as (q, seen):
        wait.until(lambda: len(seen) >= 2, "records read before the restart", timeout_s=120)
        b.restart()   # SIGKILL and start again on the same port and data
        produce(b.bootstrap, "s-outage", ["o3"])
        wait.until(lambda: len(seen) >= 3 or q.exception(), "records read after the restart", timeout_s=120)
        assert q.exception() is None
    assert seen == ["o1", "o2", "o3"]

    df = reader(spark, b.bootstrap, stream=True, subscribe="s-outage", startingOffsets="earliest",
                **{"kafka.request.timeout.ms": "2000"})
    with running(df, tmp_path / "ckpt2") as (q, seen):
        wait.until(lambda: len(seen) >= 3, "records read before the outage", timeout_s=120)
        b.kill()
        fails(q, "gave up after 2 s: no broker reachable")
    assert seen == ["o1", "o2", "o3"]


# --- another Kafka-compatible broker -------------------------------------------------------

def test_read_path_against_tansu(spark, tansu):
    bs = tansu.bootstrap
    create(bs, "tansu-src", 2)
    produce(bs, "tansu-src", [f"t0-{i}" for i in range(5)], partition=0)
    produce(bs, "tansu-src", [f"t1-{i}" for i in range(3)], partition=1)
    assert values(reader(spark, bs, subscribe="tansu-src")) == \
        [f"t0-{i}" for i in range(5)] + [f"t1-{i}" for i in range(3)]
    batches = run_available_now(reader(spark, bs, stream=True, subscribe="tansu-src",
                                       startingOffsets="earliest", maxOffsetsPerTrigger="4"))
    rows = [r for _, rs in batches for r in rs]
    assert sorted(r[3] for r in rows) == sorted([f"t0-{i}" for i in range(5)] + [f"t1-{i}" for i in range(3)])
    assert all(len(rs) <= 4 for _, rs in batches)
