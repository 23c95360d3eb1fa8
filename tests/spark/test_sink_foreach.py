"""semel.spark.foreach.foreach_batch: each micro-batch is one eos commit cycle into a
real PostgreSQL (pgserver) with the decision on a real semel broker; checked by SQL.
Failures at prepare (before the decision) and at commit (after it) fail the query;
a restart from the checkpoint ends with every input row exactly once in the table."""
from __future__ import annotations

import psycopg
import pytest

from semel.eos.ledger import Ledger
from semel.eos.outcomes import Retryable
from semel.eos.sinks.postgres import PostgresSink
from semel.spark.foreach import foreach_batch
from tests.spark.test_source import create, produce


class FailOnce(PostgresSink):
    """A PostgreSQL sink whose `op` fails once, at the n-th call (a crash-like failure)."""

    def __init__(self, *args, op: str, at: int, **kw):
        super().__init__(*args, **kw)
        self.op, self.at, self.calls = op, at, 0

    def prepare(self, txn_id, rows=()):
        return self._maybe("prepare") or super().prepare(txn_id, rows)

    def commit(self, txn_id):
        return self._maybe("commit") or super().commit(txn_id)

    def _maybe(self, op):
        if op != self.op:
            return None
        self.calls += 1
        return Retryable("injected failure") if self.calls == self.at else None


def table_rows(uri: str, table: str) -> list[tuple]:
    with psycopg.connect(uri) as conn:
        return conn.execute(f"SELECT k, v FROM {table} ORDER BY k").fetchall()


def run(spark, bs, src, ck, sink, every=10):
    df = (spark.readStream.format("semel").option("kafka.bootstrap.servers", bs).option("subscribe", src)
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(every)).load())
    fn = foreach_batch(lambda d, _b: {"postgres": [(r.k, r.v) for r in d.collect()]}, sinks=[sink],
                       bootstrap=bs, checkpoint=ck)
    q = (df.selectExpr("cast(key as string) as k", "cast(value as string) as v").writeStream.foreachBatch(fn)
         .option("checkpointLocation", ck).trigger(availableNow=True).start())
    try:
        q.awaitTermination(120)
    except Exception as exc:  # noqa: BLE001 - the query's failure is what the test reads
        return exc
    return q.exception()


@pytest.mark.parametrize("op", ["prepare", "commit"])
def test_failure_then_restart_is_exactly_once_in_postgres(spark, spark_broker, pg_uri, tmp_path, op):
    bs = spark_broker.bootstrap
    src, table = f"fe-in-{op}", f"fe_out_{op}"
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (k text PRIMARY KEY, v text)")
    create(bs, src, 1)
    produce(bs, src, [f"v{i}" for i in range(30)])
    ck = str(tmp_path / "ck")
    # the second batch fails: before the decision (prepare) or after it (commit)
    failing = FailOnce(pg_uri, table, ["k", "v"], op=op, at=2)
    assert "did not commit" in str(run(spark, bs, src, ck, failing))
    assert len(table_rows(pg_uri, table)) == 10  # batch 1 prepared at most, never visible
    assert run(spark, bs, src, ck, PostgresSink(pg_uri, table, ["k", "v"])) is None
    assert table_rows(pg_uri, table) == sorted((f"k{i}", f"v{i}") for i in range(30))
    with psycopg.connect(pg_uri) as conn:   # nothing left prepared
        assert conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0] == 0


def test_parent_left_open_by_a_crash_is_fenced_at_restart(spark, spark_broker, pg_uri, tmp_path):
    """A driver killed between commitOffsets and commitTxn leaves the parent open (its
    offsets unstable); the restarted query fences it instead of waiting out its
    timeout, aborts what was prepared and commits the batch again."""
    from semel.spark.foreach import SparkBatchBackend
    from semel.spark.sink import parse_options
    bs = spark_broker.bootstrap
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute("CREATE TABLE fe_open (k text, v text, PRIMARY KEY (k, v))")
    create(bs, "fe-open", 1)
    produce(bs, "fe-open", [f"v{i}" for i in range(10)])
    ck = str(tmp_path / "ck")
    assert run(spark, bs, "fe-open", ck, PostgresSink(pg_uri, "fe_open", ["k", "v"])) is None
    produce(bs, "fe-open", [f"w{i}" for i in range(5)])
    crashed = SparkBatchBackend(parse_options({"kafka.bootstrap.servers": bs, "checkpointLocation": ck}))
    crashed.batch = 0
    crashed.begin_txn(2)
    crashed.commit_offsets(2, Ledger(2))  # ... and the process died here
    assert run(spark, bs, "fe-open", ck, PostgresSink(pg_uri, "fe_open", ["k", "v"])) is None
    assert len(table_rows(pg_uri, "fe_open")) == 15
