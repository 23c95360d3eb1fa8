"""The semel sink after a lost checkpoint, and with a zombie run: real local Spark, a
real semel broker, an independent confluent-kafka read_committed consumer."""
from __future__ import annotations

import json
import shutil

from semel.client import Client
from semel.client import txn as wire
from semel.protocol.errors import KafkaError
from semel.spark import sink
from semel.spark import branch_writer
from semel.spark import decision as spark_decision
from tests.spark.test_source import create, produce
from tests.support.consume import read_values


def query(spark, bs, ck, group, mode):
    df = (spark.readStream.format("semel").option("kafka.bootstrap.servers", bs).option("subscribe", "rs-in")
          .option("startingOffsets", "committed").option("kafka.group.id", group).load())
    q = (df.selectExpr("key", "value").writeStream.format("semel").option("kafka.bootstrap.servers", bs)
         .option("topic", "rs-out").option("kafka.group.id", group).option("semel.atomicBatches", mode)
         .option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
    q.awaitTermination(120)
    return q.exception()


def decision(bs: str) -> dict:
    with Client(bs) as c:
        got = wire.committed_with_metadata(c, "rs-group", [("rs-in", 0), ("rs-in", 1)])
    return json.loads(got[("rs-in", 0)][1])


def test_checkpoint_loss_resumes_from_the_offsets_on_the_broker(spark, spark_broker, tmp_path):
    """A new checkpoint numbers its batches from 0 again: the decisions the old one
    left on the broker must not make the new run's batches look committed."""
    bs = spark_broker.bootstrap
    create(bs, "rs-in", 2)
    create(bs, "rs-out", 2)
    produce(bs, "rs-in", [f"a{i}" for i in range(20)], partition=0)
    produce(bs, "rs-in", [f"b{i}" for i in range(10)], partition=1)
    assert query(spark, bs, tmp_path / "ck1", "rs-group", "false") is None
    assert query(spark, bs, tmp_path / "ck1", "rs-group", "false") is None  # a second, empty run
    assert decision(bs)["atomic"] is False
    shutil.rmtree(tmp_path / "ck1")
    produce(bs, "rs-in", [f"c{i}" for i in range(5)], partition=0)
    assert query(spark, bs, tmp_path / "ck2", "rs-group", "auto") is None
    assert decision(bs)["atomic"] is True   # auto on a semel broker: mode (a)
    got = read_values(bs, "rs-out", 2, want=35)
    assert sorted(got) == sorted([f"a{i}" for i in range(20)] + [f"b{i}" for i in range(10)]
                                 + [f"c{i}" for i in range(5)])


def test_zombie_parent_is_fenced(spark_broker):
    """A previous run's commit() still holding the parent open (a zombie driver
    worker) is fenced by the new run's commit(): its EndTxn fails, the batch is the
    new run's alone."""
    bs = spark_broker.bootstrap
    create(bs, "zb-out", 1)
    o = sink.parse_options({"kafka.bootstrap.servers": bs, "semel.query.id": "zb", "topic": "zb-out",
                            "semel.atomicBatches": "false"})
    with Client(bs) as c:
        err, zombie = wire.init_producer_id(c, o.parent, o.restart_window_ms)
        assert err == KafkaError.NONE
        assert wire.add_offsets(c, zombie, o.group) == KafkaError.NONE
        assert wire.txn_offset_commit(c, zombie, o.group, {("zb-out", 0): 0}, "zombie") == {
            ("zb-out", 0): KafkaError.NONE}
        msg = branch_writer.write_branch(o, {"value": 0}, iter([(b"fresh",)]), 0, 0, 0)
        spark_decision.commit_batch(o, [msg], 0)
        assert wire.end_txn(c, o.parent, zombie.pid, zombie.epoch, True) in (
            KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
    assert read_values(bs, "zb-out", 1, want=1) == ["fresh"]


def test_broker_outage_fails_the_query_without_partial_output(spark, start_broker, tmp_path):
    """The broker dies mid-query: bounded retries (kafka.request.timeout.ms), then the
    query fails; no batch is visible in part; a restart from the checkpoint once the
    broker is back writes every row exactly once."""
    from tests.support.wait import until
    b = start_broker("--group-initial-rebalance-delay-ms", "0")
    bs = b.bootstrap
    create(bs, "ou-in", 2)
    create(bs, "ou-out", 2)
    produce(bs, "ou-in", [f"a{i}" for i in range(200)], partition=0)
    produce(bs, "ou-in", [f"b{i}" for i in range(200)], partition=1)
    ck = str(tmp_path / "ck")

    def start(trigger, per_trigger=20):
        df = (spark.readStream.format("semel").option("kafka.bootstrap.servers", bs).option("subscribe", "ou-in")
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(per_trigger))
              .option("kafka.request.timeout.ms", "3000").load())
        return (df.selectExpr("key", "value").writeStream.format("semel").option("kafka.bootstrap.servers", bs)
                .option("topic", "ou-out").option("kafka.request.timeout.ms", "3000")
                .option("checkpointLocation", ck).trigger(**trigger).start())

    q = start({"processingTime": "100 milliseconds"})
    until(lambda: len(read_values(bs, "ou-out", 2, idle_s=0.3)) >= 20, "a first batch committed", 120)
    b.kill()
    try:
        assert q.awaitTermination(180), "the query kept running with its broker down"
    except Exception:  # noqa: BLE001 - the failure is the expected end
        pass
    assert q.exception() is not None
    b.start()
    got = read_values(bs, "ou-out", 2, idle_s=1.0)
    assert len(got) % 20 == 0 and len(set(got)) == len(got)   # whole batches only
    # The restart only has to finish the input: the batch planned before the kill re-runs
    # with its recorded range, the rest goes in one or two batches instead of ~20.
    q = start({"availableNow": True}, per_trigger=400)
    q.awaitTermination(180)
    assert q.exception() is None
    got = read_values(bs, "ou-out", 2, want=400)
    assert sorted(got) == sorted([f"a{i}" for i in range(200)] + [f"b{i}" for i in range(200)])


def test_late_speculative_attempt_ends_its_own_branch(spark_broker):
    """A speculative copy (an attempt number commit() does not fence) still writing
    when the batch is decided: its rows never become visible and its transaction is
    not left open (which would hold back read_committed readers for the restart
    window). Local Spark never launches speculative copies (one host), so the two
    attempts are driven here directly, interleaved through the rows iterator."""
    from semel.client.admin import describe_transactions
    bs = spark_broker.bootstrap
    create(bs, "sp-out", 1)
    o = sink.probe(sink.parse_options({"kafka.bootstrap.servers": bs, "semel.query.id": "sp", "topic": "sp-out"}))
    winner = branch_writer.write_branch(o, {"value": 0}, iter([(b"won",)]), 0, 0, 0)

    def late_rows():
        yield (b"late-1",)
        spark_decision.commit_batch(o, [winner], 0)   # the batch is decided while this attempt writes
        yield (b"late-2",)

    late = branch_writer.write_branch(o, {"value": 0}, late_rows(), 0, 0, 5)
    assert late.skipped
    assert read_values(bs, "sp-out", 1, want=1) == ["won"]
    with Client(bs) as c:
        [d] = describe_transactions(c, [spark_decision.branch_id(o, 0, 0, 5)])
    assert d.state == "CompleteAbort"
