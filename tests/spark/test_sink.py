"""format("semel") as an exactly-once Spark sink (mode b, standard Kafka APIs) against
a real semel broker, read back by an independent confluent-kafka read_committed consumer."""
from __future__ import annotations

import json

import pytest
from confluent_kafka import Consumer, TopicPartition

from semel.client import Client
from semel.client import txn as wire
from semel.spark import sink
from semel.spark import branch_writer
from semel.spark import decision as spark_decision
from semel.spark import routing
from semel.spark import sink_options
from tests.spark.test_source import create, produce
from tests.support.consume import read_values


def stream(spark, bootstrap, src, dst, checkpoint, **options):
    df = (spark.readStream.format("semel").option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", src).option("startingOffsets", "earliest").load())
    w = (df.selectExpr("key", "concat('out-', cast(value as string)) as value").writeStream.format("semel")
         .option("kafka.bootstrap.servers", bootstrap).option("topic", dst)
         .option("checkpointLocation", str(checkpoint)))
    for k, v in options.items():
        w = w.option(k, v)
    return w


def committed_meta(bootstrap, group, tps):
    with Client(bootstrap) as c:
        return wire.committed_with_metadata(c, group, tps)


def test_stream_exactly_once_and_offsets_with_decision(spark, spark_broker, tmp_path):
    bs = spark_broker.bootstrap
    create(bs, "sk-in", 2)
    create(bs, "sk-out", 3)
    produce(bs, "sk-in", [f"a{i}" for i in range(50)], partition=0)
    produce(bs, "sk-in", [f"b{i}" for i in range(30)], partition=1)
    q = stream(spark, bs, "sk-in", "sk-out", tmp_path / "ck").trigger(availableNow=True).start()
    q.awaitTermination(120)
    assert q.exception() is None
    # a second run from the same checkpoint with new input: only the new rows
    produce(bs, "sk-in", [f"c{i}" for i in range(10)], partition=0)
    q = stream(spark, bs, "sk-in", "sk-out", tmp_path / "ck").trigger(availableNow=True).start()
    q.awaitTermination(120)
    assert q.exception() is None
    got = read_values(bs, "sk-out", 3, want=90)
    want = [f"out-a{i}" for i in range(50)] + [f"out-b{i}" for i in range(30)] + [f"out-c{i}" for i in range(10)]
    assert sorted(got) == sorted(want)
    # the source end offsets are committed under the query's group, with the decision
    o = sink.parse_options({"kafka.bootstrap.servers": bs, "checkpointLocation": str(tmp_path / "ck")})
    meta = committed_meta(bs, o.group, [("sk-in", 0), ("sk-in", 1)])
    assert {tp: off for tp, (off, _) in meta.items()} == {("sk-in", 0): 60, ("sk-in", 1): 30}
    doc = json.loads(meta[("sk-in", 0)][1])
    assert doc["semel-spark"] == 1 and doc["batch"] >= 1


def test_commit_replayed_after_decision_rolls_forward(spark_broker, tmp_path):
    """commit() of a decided batch again (Spark may call it twice) changes nothing;
    a replay's fresh branch is aborted, never committed next to the recorded one."""
    bs = spark_broker.bootstrap
    create(bs, "rf-out", 1)
    o = sink.parse_options({"kafka.bootstrap.servers": bs, "semel.query.id": "rf", "topic": "rf-out"})
    cols = {"key": 0, "value": 1}
    first = branch_writer.write_branch(o, cols, iter([(None, b"x1"), (None, b"x2")]), 0, 0, 0)
    spark_decision.commit_batch(o, [first], 0)
    spark_decision.commit_batch(o, [first], 0)  # a second commit() of the same batch
    # a replayed task after the decision writes nothing
    again = branch_writer.write_branch(o, cols, iter([(None, b"x1"), (None, b"x2")]), 0, 0, 1)
    assert again.skipped
    spark_decision.commit_batch(o, [again], 0)
    assert sorted(read_values(bs, "rf-out", 1, want=2)) == ["x1", "x2"]


def test_losing_attempt_is_aborted(spark_broker):
    """A failed/speculative attempt's branch (attempt 0) is fenced when attempt 1 wins."""
    bs = spark_broker.bootstrap
    create(bs, "la-out", 1)
    o = sink.parse_options({"kafka.bootstrap.servers": bs, "semel.query.id": "la", "topic": "la-out"})
    cols = {"value": 0}
    branch_writer.write_branch(o, cols, iter([(b"lost",)]), 0, 0, 0)
    win = branch_writer.write_branch(o, cols, iter([(b"won",)]), 0, 0, 1)
    spark_decision.commit_batch(o, [win], 0)
    # the LSO moves past the fenced branch: a read_committed reader sees only the winner
    assert read_values(bs, "la-out", 1, want=1) == ["won"]
    c = Consumer({"bootstrap.servers": bs, "group.id": "x", "isolation.level": "read_committed"})
    lo, hi = c.get_watermark_offsets(TopicPartition("la-out", 0), timeout=10)
    c.close()
    assert hi >= 3  # both batches and at least one marker reached the log


def test_bad_input_is_a_clear_error_at_start(spark, spark_broker, tmp_path):
    bs = spark_broker.bootstrap
    df = spark.createDataFrame([(1, 2)], "key int, value int")
    with pytest.raises(Exception, match="column 'key' must be binary or string"):
        df.write.mode("append").format("semel").option("kafka.bootstrap.servers", bs).option("topic", "nope").save()
    ok = spark.createDataFrame([("k", "v")], "key string, value string")
    with pytest.raises(Exception, match="UNKNOWN_TOPIC_OR_PARTITION"):
        ok.write.mode("append").format("semel").option("kafka.bootstrap.servers", bs).option("topic", "no-such-topic").save()
    with pytest.raises(Exception, match="cannot connect"):
        ok.write.mode("append").format("semel").option("kafka.bootstrap.servers", "127.0.0.1:1").option("topic", "t").save()
    create(bs, "bad-out", 1)
    with pytest.raises(Exception, match="refuses a transaction timeout"):
        ok.write.mode("append").format("semel").option("kafka.bootstrap.servers", bs).option("topic", "bad-out") \
            .option("semel.restartWindowMs", str(10**9)).save()


def test_batch_write(spark, spark_broker):
    bs = spark_broker.bootstrap
    create(bs, "bw-out", 2)
    df = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(40)], "key string, value string").repartition(3)
    df.write.mode("append").format("semel").option("kafka.bootstrap.servers", bs).option("topic", "bw-out").save()
    assert sorted(read_values(bs, "bw-out", 2, want=40)) == sorted(f"v{i}" for i in range(40))


def test_attempt_that_finishes_after_the_decision_ends_its_own_branch(spark_broker):
    """A speculative copy (attempt 3, beyond what commit() fences) that finishes
    writing after the batch was decided aborts its own branch: never visible, and
    it does not hold the partition's last stable offset back."""
    bs = spark_broker.bootstrap
    o = mode_b(bs, "late", "late-out")
    cols = {"value": 0}
    win = branch_writer.write_branch(o, cols, iter([(b"won",)]), 0, 0, 0)

    def rows_then_decide():
        yield (b"late",)
        spark_decision.commit_batch(o, [win], 0)  # the decision lands while attempt 3 is writing
    late = branch_writer.write_branch(o, cols, rows_then_decide(), 0, 0, 3)
    assert late.skipped
    assert read_values(bs, "late-out", 1, want=1) == ["won"]
    with Client(bs) as raw:
        stable = raw.list_offset("late-out", 0, -1, isolation=1)
    assert stable == raw_end(bs, "late-out")  # nothing left open: LSO == log end


def test_zombie_commit_after_the_new_run_decided_adds_nothing(spark_broker):
    """A zombie run's commit() of a batch the new run already committed rolls the
    new run's decision forward and commits none of its own rows."""
    bs = spark_broker.bootstrap
    o = mode_b(bs, "zc", "zc-out")
    cols = {"value": 0}
    zombie = branch_writer.write_branch(o, cols, iter([(b"zombie",)]), 0, 0, 1)
    new = branch_writer.write_branch(o, cols, iter([(b"new",)]), 0, 0, 0)
    spark_decision.commit_batch(o, [new], 0)
    spark_decision.commit_batch(o, [zombie], 0)
    assert read_values(bs, "zc-out", 1, want=1) == ["new"]


def mode_b(bs: str, query: str, topic: str) -> sink_options.SinkOptions:
    """Mode (b) options of a query writing to a new one-partition topic."""
    create(bs, topic, 1)
    return sink.parse_options({"kafka.bootstrap.servers": bs, "semel.query.id": query, "topic": topic,
                               "semel.atomicBatches": "false"})


def raw_end(bs: str, topic: str) -> int:
    with Client(bs) as raw:
        return raw.list_offset(topic, 0, -1, isolation=0)


def test_on_one_broker_every_role_is_one_connection(spark_broker):
    """The sink routes each request to its role's broker; on a single node that is one
    connection for all of them, so each step keeps its one-write pipelining (the speed
    bench.spark_pipeline measures)."""
    bs = spark_broker.bootstrap
    create(bs, "one-conn", 2)
    o = sink.probe(sink.parse_options({"kafka.bootstrap.servers": bs, "semel.query.id": "oc", "topic": "one-conn"}))
    with routing.connect(o) as r:
        c = routing.txn_coordinator(r, o, o.parent)
        assert routing.group_coordinator(r, o) is c
        assert all(routing.partition_leader(r, ("one-conn", p)) is c for p in range(2))
        assert routing.txn_coordinator(r, o, spark_decision.branch_id(o, 0, 1, 0)) is c
