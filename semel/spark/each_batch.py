"""Every output mode, Update included, through foreachBatch: the exactly-once sink's
own protocol driven from a foreachBatch function instead of a Python data source.

pyspark 4.3 refuses a streaming query in Update mode for every Python data source
(its PythonWriteBuilder has no SupportsStreamingUpdateAsAppend), while foreachBatch
takes every mode. `write_each_batch(options)` is that function:

    opts = {"kafka.bootstrap.servers": bs, "topic": "out", "checkpointLocation": ck}
    (counts.selectExpr("key", "value").writeStream.outputMode("update")
           .foreachBatch(write_each_batch(opts)).option("checkpointLocation", ck).start())

The options are the sink's (docs/spark.md), with the query's `checkpointLocation`
among them: the function is not told the query's checkpoint any other way. For each
micro-batch, on the driver side: the batch's source end offsets from the checkpoint's
offset log; one Spark job whose tasks each write their partition of the batch into
their own branch (semel.spark.branch_writer, as format("semel")'s tasks do, with the
same decided-yet check); the branch messages of the winning attempts collected to the
driver (small: no rows travel); then commit_batch, the same decision, roll-forward
and abort of losers as format("semel")'s commit(). A batch Spark replays after a crash
is recognised from the query's committed offsets (by the tasks, which then write
nothing, and by commit_batch, which rolls it forward), never written twice. The query group, parent transaction and branch ids are those format("semel")
derives from the same options, so a query may move between the two.

The batch is written by as many Python tasks as the executors run at once (their
cores), not by one per shuffle partition: a Python task costs PySpark a worker round
whether it holds rows or not, and a stateful query has spark.sql.shuffle.partitions of
them (200 by default) however small the batch. The batch is coalesced (no shuffle: each
task reads several of the stateful stage's partitions in turn), or with
`semel.write.rebalance` spread round robin (one more shuffle; for a skewed batch);
`semel.write.tasks` sets the number. Which rows a task gets does not matter to the
guarantee: every task writes its own branch and the batch's decision takes the
branches of the winning attempts, whatever rows each held.
"""
from __future__ import annotations

import pickle
from typing import Any, Callable, Mapping

from semel.spark import decision, sink
from semel.spark import options as opt
from semel.spark.branch_writer import ArrowInput, write_branch
from semel.spark.sink_options import SinkError


def write_each_batch(options: Mapping[str, str]) -> Callable[[Any, int], None]:
    """The foreachBatch function writing each micro-batch to semel exactly once."""
    opts = dict(options)
    if not opts.get("checkpointLocation"):
        raise SinkError("write_each_batch needs the query's 'checkpointLocation' among its options (the "
                        "batch's source offsets are read from it, and it names the query)")
    try:
        shape = opt.parse_write_tasks(opts)
    except opt.OptionError as exc:
        raise SinkError(str(exc)) from None

    def run(df, batch_id: int) -> None:
        from semel.spark.checkpoint import session_settings
        o = sink.parse_options(opts, session_settings(df.sparkSession), each_batch=True)
        cols = sink.check_schema(df.schema, o.topic)
        o = sink.probe_cached(o)
        o, plan = decision.plan_batch(o)
        offsets = plan.offsets if plan.batch == batch_id else decision.batch_offsets(o, batch_id)
        parts = decision.decision_partitions(o, offsets)
        # The job runs even for a batch decided before a crash: Spark requires a stateful
        # query's foreachBatch to process every partition (its state stores commit then);
        # each task finds the batch decided and writes nothing, and commit_batch rolls it forward.
        messages = _write(spread(df, shape), o, cols, batch_id, parts)
        decision.commit_batch(o, messages, batch_id, offsets)
    return run


def spread(df, shape: opt.WriteTasks):
    """The batch over `shape.tasks` partitions, by default the executors' cores."""
    n = shape.tasks or executor_cores(df.sparkSession)
    if n is None:
        return df
    return df.repartition(n) if shape.rebalance else df.coalesce(n)


def executor_cores(spark) -> int | None:
    """How many tasks the executors run at once (Spark's default parallelism: the sum of
    the executors' cores, or local[N]'s N); None where the session has no SparkContext
    to ask (Spark Connect)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # noqa: BLE001 - Spark Connect raises its own error for sparkContext
        return None


def _write(df, o, cols: dict[str, int], batch: int, parts) -> list:
    """One Spark job: each task writes its partition into its branch and returns its
    BranchMessage (pickled in a one-row Arrow batch); the winners' reach the driver."""
    def task(batches):
        import pyarrow as pa
        from pyspark import TaskContext
        ctx = TaskContext.get()
        m = write_branch(o, cols, ArrowInput(batches), batch, ctx.partitionId(), ctx.attemptNumber(), parts=parts)
        yield pa.RecordBatch.from_pydict({"m": [pickle.dumps(m)]}, schema=pa.schema([("m", pa.binary())]))
    return [pickle.loads(row.m) for row in df.mapInArrow(task, "m binary").collect()]
