"""Mode (a) of the semel sink: atomic micro-batches through the broker's branch
extension (semel/coordinator/txn.py), against real semel/Tansu brokers and local
Spark, read back by an independent confluent-kafka read_committed consumer."""
from __future__ import annotations

import pytest

from semel.client import Client
from semel.client import txn as wire
from semel.spark import sink
from tests.spark.test_source import create, produce
from tests.support.consume import read_values


def opts(bs: str, query: str, topic: str, mode: str) -> sink.SinkOptions:
    return sink.probe(sink.parse_options({"kafka.bootstrap.servers": bs, "semel.query.id": query, "topic": topic,
                                          "semel.atomicBatches": mode}))


def two_branches(o: sink.SinkOptions, batch: int) -> list[sink.BranchMessage]:
    cols = {"value": 0, "partition": 1}
    return [sink.write_branch(o, cols, iter([(f"p{p}-{i}".encode(), p) for i in range(3)]), batch, p, 0)
            for p in (0, 1)]


def test_probe_resolves_the_mode(spark_broker):
    bs = spark_broker.bootstrap
    create(bs, "am-probe", 1)
    assert opts(bs, "amp", "am-probe", "auto").atomic
    assert opts(bs, "amp", "am-probe", "true").atomic
    assert not opts(bs, "amp", "am-probe", "false").atomic


@pytest.mark.parametrize("mode", ["true", "false"])
def test_decision_alone_makes_the_whole_batch_visible_only_in_mode_a(spark_broker, monkeypatch, mode):
    """The driver dies right after the parent's EndTxn (the decision), before any
    branch EndTxn: in mode (a) the decision already committed every branch at once;
    in mode (b) nothing is visible until the next commit() rolls forward."""
    bs = spark_broker.bootstrap
    topic = f"am-dec-{mode}"
    create(bs, topic, 2)
    o = opts(bs, f"amd{mode}", topic, mode)
    msgs = two_branches(o, 0)
    with monkeypatch.context() as m:
        m.setattr(sink, "_end_branch", lambda *a: None)     # the crash: no branch is ended by the driver
        m.setattr(sink, "_fence_losers", lambda *a: None)
        sink.commit_batch(o, msgs, 0)
    want = sorted(f"p{p}-{i}" for p in (0, 1) for i in range(3))
    if mode == "true":
        assert sorted(read_values(bs, topic, 2, want=6)) == want
    else:
        assert read_values(bs, topic, 2, idle_s=0.5) == []
        sink.commit_batch(o, msgs, 0)   # Spark's replayed commit() of the decided batch rolls forward
        assert sorted(read_values(bs, topic, 2, want=6)) == want


def test_undecided_batch_is_aborted_whole_when_a_task_reruns(spark_broker):
    """A crash after the join, before the decision: the re-run task (same branch id)
    aborts the parent and every joined branch; only the re-run's rows get committed."""
    bs = spark_broker.bootstrap
    create(bs, "am-rerun", 2)
    o = opts(bs, "amr", "am-rerun", "true")
    first = two_branches(o, 0)
    with Client(bs) as c:
        err, st = wire.init_producer_id(c, o.parent, o.restart_window_ms)
        sink._join(c, o, st, [sink.branch_id(o, 0, m.partition, m.attempt) for m in first])
    again = two_branches(o, 0)   # Spark replays batch 0 after the restart: attempt numbers start at 0 again
    sink.commit_batch(o, again, 0)
    assert sorted(read_values(bs, "am-rerun", 2, want=6)) == sorted(f"p{p}-{i}" for p in (0, 1) for i in range(3))


def test_batch_write_in_mode_a(spark, spark_broker):
    bs = spark_broker.bootstrap
    create(bs, "am-bw", 2)
    df = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(30)], "key string, value string").repartition(3)
    (df.write.mode("append").format("semel").option("kafka.bootstrap.servers", bs).option("topic", "am-bw")
     .option("semel.atomicBatches", "true").save())
    assert sorted(read_values(bs, "am-bw", 2, want=30)) == sorted(f"v{i}" for i in range(30))


def test_atomic_true_on_a_broker_without_the_extension_refuses_to_start(tansu):
    create(tansu.bootstrap, "am-tansu", 1)
    with pytest.raises(sink.SinkError, match="does not support atomic batches"):
        opts(tansu.bootstrap, "amt", "am-tansu", "true")
    assert not opts(tansu.bootstrap, "amt", "am-tansu", "auto").atomic


@pytest.mark.parametrize("mode", ["true", "false"])
def test_a_batch_of_many_tasks(spark_broker, mode):
    """300 writing tasks: mode (a) records no branch list (the parent holds them on the
    broker) and commits all; mode (b) cannot fit them into 4 KB of offset metadata and
    says so, before any decision (nothing visible)."""
    bs = spark_broker.bootstrap
    topic = f"am-many-{mode}"
    create(bs, topic, 1)
    o = opts(bs, f"amm{mode}", topic, mode)
    msgs = [sink.write_branch(o, {"value": 0}, iter([(f"t{p}".encode(),)]), 0, p, 0) for p in range(300)]
    if mode == "true":
        sink.commit_batch(o, msgs, 0)
        assert sorted(read_values(bs, topic, 1, want=300)) == sorted(f"t{p}" for p in range(300))
    else:
        with pytest.raises(sink.SinkError, match="too many to record"):
            sink.commit_batch(o, msgs, 0)
        sink.abort_batch(o, msgs, 0)
        assert read_values(bs, topic, 1, idle_s=0.5) == []


@pytest.mark.parametrize("mode", ["true", "false"])
def test_tasks_that_wrote_nothing(spark, spark_broker, mode):
    """An empty partition's task leaves an empty branch (no transaction): the batch
    still commits in both modes, streaming and batch."""
    bs = spark_broker.bootstrap
    topic = f"am-empty-{mode}"
    create(bs, topic, 1)
    o = opts(bs, f"ame{mode}", topic, mode)
    full = sink.write_branch(o, {"value": 0}, iter([(b"x",)]), 0, 0, 0)
    empty = sink.write_branch(o, {"value": 0}, iter([]), 0, 1, 0)
    sink.commit_batch(o, [full, empty], 0)
    assert read_values(bs, topic, 1, want=1) == ["x"]
    df = spark.createDataFrame([("v",)], "value string").repartition(3)   # two of three tasks empty
    (df.write.mode("append").format("semel").option("kafka.bootstrap.servers", bs).option("topic", topic)
     .option("semel.atomicBatches", mode).save())
    assert sorted(read_values(bs, topic, 1, want=2)) == ["v", "x"]
