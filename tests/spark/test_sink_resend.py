"""A broker connection broken mid-request is resent, not failed: the sink's tasks and
its commit() run against a real semel broker process through a TCP proxy that, for
one kind of request at a time, lets every other one reach the broker and be carried
out and then closes the connection before the answer (tests/support/cutting_proxy);
then a real Spark streaming query (local mode, where a failed task fails the query)
with every kind cut at once.
Every batch still commits without an error and an unmodified confluent-kafka
read_committed reader sees each row exactly once: the resent Produce is dropped by its
sequence, the resent transaction requests are answered as the coordinator already
did them, and the reads are just asked again."""
from __future__ import annotations

import pytest

from semel.protocol.api_keys import ApiKey
from semel.spark import branch_writer
from semel.spark import decision as spark_decision
from semel.spark import sink
from tests.spark.conftest import FAST_GROUPS
from tests.spark.test_source import create, produce
from tests.support.brokers import module_broker
from tests.support.cutting_proxy import CuttingProxy
from tests.support.markers import starts_processes
from tests.support.read_end import read_to_end

PROXY_HOST = "127.0.0.2"
TASKS = 3
BATCHES = 2
# What the sink sends in a batch: the decided-yet reads, branch and parent
# InitProducerId, the joins, Produce, the parent's offsets and both kinds of EndTxn.
CUT = [ApiKey.OFFSET_FETCH, ApiKey.INIT_PRODUCER_ID, ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.PRODUCE,
       ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.TXN_OFFSET_COMMIT, ApiKey.END_TXN]


@pytest.fixture(scope="module")
@starts_processes
def proxied(tmp_path_factory):
    """(broker, proxy): the broker advertises the proxy's host on its own port."""
    with module_broker(tmp_path_factory, "resend-broker", *FAST_GROUPS, "--advertised-host", PROXY_HOST) as b:
        proxy = CuttingProxy(PROXY_HOST, b.port, b.bootstrap)
        try:
            yield b, proxy
        finally:
            proxy.close()


def batch(o, n: int) -> None:
    """Batch n: TASKS tasks of two rows each, then commit()."""
    msgs = [branch_writer.write_branch(o, {"value": 0}, iter([(f"b{n}t{t}r{i}".encode(),) for i in range(2)]),
                                       n, t, 0)
            for t in range(TASKS)]
    assert all(m.rows == 2 and not m.skipped for m in msgs)
    spark_decision.commit_batch(o, msgs, n)


@pytest.mark.parametrize("mode", ["true", "false"])
@pytest.mark.parametrize("api", CUT, ids=[k.name for k in CUT])
def test_a_request_cut_before_its_answer_is_resent(proxied, api, mode):
    broker, proxy = proxied
    topic = f"resend-{api.name.lower()}-{mode}"
    create(broker.bootstrap, topic, 2)
    o = sink.probe(sink.parse_options({"kafka.bootstrap.servers": f"{PROXY_HOST}:{broker.port}",
                                       "semel.query.id": topic, "topic": topic, "semel.atomicBatches": mode,
                                       "semel.restartWindowMs": "600000"}))
    proxy.cut(api)
    try:
        for n in range(BATCHES):
            batch(o, n)
        cuts = proxy.cuts[api]
    finally:
        proxy.disarm()
    assert cuts >= 1, f"no {api.name} was cut"
    got = read_to_end(broker.bootstrap, topic, 2)
    want = [f"b{n}t{t}r{i}" for n in range(BATCHES) for t in range(TASKS) for i in range(2)]
    assert sorted(got) == sorted(want)


def test_a_spark_query_through_cut_connections_writes_exactly_once(spark, proxied, tmp_path):
    broker, proxy = proxied
    via = f"{PROXY_HOST}:{broker.port}"
    create(broker.bootstrap, "resend-spark-in", 2)
    create(broker.bootstrap, "resend-spark-out", 2)
    produce(broker.bootstrap, "resend-spark-in", [f"v{i}" for i in range(300)])
    proxy.cut(*CUT)
    q = (spark.readStream.format("semel").option("kafka.bootstrap.servers", via).option("subscribe", "resend-spark-in")
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "100").load()
         .selectExpr("value").repartition(3)
         .writeStream.format("semel").option("kafka.bootstrap.servers", via).option("topic", "resend-spark-out")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    try:
        q.awaitTermination()
        cuts = dict(proxy.cuts)
    finally:
        proxy.disarm()
    assert q.exception() is None
    assert {ApiKey.PRODUCE, ApiKey.INIT_PRODUCER_ID, ApiKey.END_TXN} <= cuts.keys(), cuts
    got = read_to_end(broker.bootstrap, "resend-spark-out", 2)
    assert sorted(got) == sorted(f"v{i}" for i in range(300))
