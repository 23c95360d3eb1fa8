"""The sink's checkpoint reads: only on the driver side, through pyarrow.fs.

- A streaming query in local mode whose tasks fail on any look at the checkpoint
  directory (an audit hook in the task's Python worker, on while write() runs)
  still writes exactly once, with the query's id and the source offsets in each
  decision: tasks get everything from the writer object.
- A Spark checkpoint layout at s3a://bucket/path on moto's S3 server, read back by
  the connector's reader with Spark's S3A settings mapped.
"""
from __future__ import annotations

import json

import pytest

from semel.spark import checkpoint, decision, sink, sink_options
from tests.spark.test_sink import committed_meta
from tests.spark.test_source import create, produce
from tests.support.consume import read_values
from tests.support.services import s3_endpoint  # noqa: F401 - fixture


def guarded_source(root: str):
    """format("semel_guarded"): the semel sink whose tasks raise PermissionError on any
    open, listdir or scandir under `root` while they write. Made in a function, so
    Spark pickles the classes by value into its workers."""
    import sys

    from pyspark.sql.datasource import DataSourceStreamArrowWriter

    from semel.spark.datasource import SemelDataSource

    def hook(event, args):
        guard = getattr(sys, "_semel_ck_guard", None)
        if guard is None or not guard["on"] or event not in ("open", "os.listdir", "os.scandir") or not args:
            return
        path = args[0]
        if isinstance(path, (str, bytes)) and str(path if isinstance(path, str) else path.decode()).startswith(root):
            raise PermissionError(f"a task looked at the checkpoint: {event} {path}")

    class Guarded(DataSourceStreamArrowWriter):
        def __init__(self, inner):
            self.inner = inner

        def write(self, iterator):
            if not hasattr(sys, "_semel_ck_guard"):
                sys._semel_ck_guard = {"on": False}
                sys.addaudithook(hook)
            sys._semel_ck_guard["on"] = True
            try:
                return self.inner.write(iterator)
            finally:
                sys._semel_ck_guard["on"] = False

        def commit(self, messages, batchId):
            self.inner.commit(messages, batchId)

        def abort(self, messages, batchId):
            self.inner.abort(messages, batchId)

    class GuardedSource(SemelDataSource):
        @classmethod
        def name(cls):
            return "semel_guarded"

        def streamWriter(self, schema, overwrite):
            return Guarded(super().streamWriter(schema, overwrite))

    return GuardedSource


def test_tasks_never_read_the_checkpoint(spark, spark_broker, tmp_path):
    bs = spark_broker.bootstrap
    create(bs, "ck-in", 2)
    create(bs, "ck-out", 2)
    produce(bs, "ck-in", [f"a{i}" for i in range(40)], partition=0)
    produce(bs, "ck-in", [f"b{i}" for i in range(20)], partition=1)
    ck = tmp_path / "ck"
    spark.dataSource.register(guarded_source(str(ck)))
    q = (spark.readStream.format("semel").option("kafka.bootstrap.servers", bs).option("subscribe", "ck-in")
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "25").load()
         .selectExpr("key", "concat('out-', cast(value as string)) as value").writeStream
         .format("semel_guarded").option("kafka.bootstrap.servers", bs).option("topic", "ck-out")
         .option("semel.atomicBatches", "false").option("checkpointLocation", str(ck))
         .trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert q.exception() is None, q.exception()
    got = read_values(bs, "ck-out", 2, want=60)
    assert sorted(got) == sorted([f"out-a{i}" for i in range(40)] + [f"out-b{i}" for i in range(20)])
    assert len(q.recentProgress) >= 3  # several batches, each checked by its tasks
    # the last decision names this query (Spark's id in the checkpoint) and carries its offsets
    o = sink.parse_options({"kafka.bootstrap.servers": bs, "checkpointLocation": str(ck)})
    meta = committed_meta(bs, o.group, [("ck-in", 0), ("ck-in", 1)])
    assert {tp: off for tp, (off, _) in meta.items()} == {("ck-in", 0): 40, ("ck-in", 1): 20}
    doc = json.loads(meta[("ck-in", 0)][1])
    assert doc["query"] == json.loads((ck / "metadata").read_text())["id"]


def test_writer_for_tasks_carries_the_plan_but_no_checkpoint_settings(tmp_path):
    """The object Spark pickles to the tasks: the planned batch and its offsets and the
    query's id; the S3 secret of the checkpoint's file system stays on the driver side."""
    import pickle
    ck = tmp_path / "ck"
    (ck / "offsets").mkdir(parents=True)
    (ck / "metadata").write_text('{"id":"q-1"}')
    for b in (0, 1):
        (ck / "offsets" / str(b)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{{"t":{{"0":{10 * (b + 1)}}}}}\n')
    (ck / "offsets" / ".1.crc").write_text("x")
    o = sink.parse_options({"kafka.bootstrap.servers": "127.0.0.1:1", "checkpointLocation": f"file://{ck}",
                            "topic": "out"}, {"fs.s3a.secret.key": "s3cr3t"})
    o, plan = decision.plan_batch(o)
    w = sink.SemelStreamWriter(o, {"value": 0}, plan)
    task_side = pickle.loads(pickle.dumps(w))
    assert (task_side.plan.batch, task_side.plan.offsets, task_side.o.query) == (1, {("t", 0): 20}, "q-1")
    assert task_side.o.fs == () and b"s3cr3t" not in pickle.dumps(w)
    assert w.o.fs == (("fs.s3a.secret.key", "s3cr3t"),)  # the driver-side writer keeps them for commit()


def test_registered_source_carries_the_sessions_fs_settings():
    """register(spark) hands Spark a class that takes the session's settings along when
    pickled (Spark's Python workers on the driver side have no session to ask)."""
    import subprocess
    import sys

    from pyspark import cloudpickle

    from semel.spark import datasource
    cls = datasource.source_class(checkpoint.hadoop_settings({"spark.hadoop.fs.s3a.endpoint": "h:9", "spark.app": "x"}))
    code = "import sys, pickle; c = pickle.loads(sys.stdin.buffer.read()); print(c.name(), c.fs_settings)"
    out = subprocess.run([sys.executable, "-c", code], input=cloudpickle.dumps(cls), capture_output=True, check=True)
    assert out.stdout.decode().strip() == "semel {'fs.s3a.endpoint': 'h:9'}"
    assert datasource.source_class({}) is datasource.SemelDataSource


def test_s3a_settings_map_onto_pyarrow():
    got = checkpoint.s3_options({"spark.hadoop.fs.s3a.endpoint": "minio:9000", "spark.hadoop.fs.s3a.access.key": "k",
                                 "spark.hadoop.fs.s3a.secret.key": "s", "spark.hadoop.fs.s3a.path.style.access": "true",
                                 "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
                                 "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1", "spark.executor.memory": "1g"})
    assert got == {"access_key": "k", "secret_key": "s", "region": "eu-west-1", "scheme": "http",
                   "endpoint_override": "minio:9000", "force_virtual_addressing": False}
    assert checkpoint.s3_options({"fs.s3a.endpoint": "https://s3.example:443"})["scheme"] == "https"
    with pytest.raises(checkpoint.CheckpointError, match="not supported"):
        checkpoint.filesystem("wasb://c@a/x")


def test_checkpoint_on_s3_read_with_spark_s3a_settings(s3_endpoint):  # noqa: F811 - fixture
    import boto3
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                      region_name="us-east-1")
    s3.create_bucket(Bucket="ck-bucket")
    root = "queries/q1"
    layout = {"metadata": '{"id":"5a7b-q1"}',
              "offsets/0": 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n{"in":{"0":5,"1":7}}',
              "offsets/1": 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":2}\n{"in":{"0":9,"1":7}}',
              "offsets/.1.crc": "crc", "commits/0": "v1\n{}"}
    for name, text in layout.items():
        s3.put_object(Bucket="ck-bucket", Key=f"{root}/{name}", Body=text.encode())
    spark_conf = {"spark.hadoop.fs.s3a.endpoint": s3_endpoint, "spark.hadoop.fs.s3a.access.key": "testing",
                  "spark.hadoop.fs.s3a.secret.key": "testing", "spark.hadoop.fs.s3a.path.style.access": "true",
                  "spark.hadoop.fs.s3a.endpoint.region": "us-east-1"}
    loc = f"s3a://ck-bucket/{root}"
    ck = checkpoint.Checkpoint(loc, checkpoint.hadoop_settings(spark_conf))
    assert ck.query_id() == "5a7b-q1"
    assert ck.latest_batch() == 1
    assert ck.offset_lines(2) is None
    # the sink's own reads, as streamWriter() and commit() make them
    o = sink.parse_options({"kafka.bootstrap.servers": "127.0.0.1:1", "checkpointLocation": loc, "topic": "out"},
                           checkpoint.hadoop_settings(spark_conf))
    assert decision.batch_offsets(o, 0) == {("in", 0): 5, ("in", 1): 7}
    o, plan = decision.plan_batch(o)
    assert (o.query, plan.batch, plan.offsets) == ("5a7b-q1", 1, {("in", 0): 9, ("in", 1): 7})
    # a store that cannot be reached: a clear failure, never an empty plan
    bad = sink.parse_options({"kafka.bootstrap.servers": "127.0.0.1:1", "checkpointLocation": loc, "topic": "out"},
                             dict(checkpoint.hadoop_settings(spark_conf), **{"fs.s3a.endpoint": "http://127.0.0.1:1"}))
    with pytest.raises(sink_options.SinkError, match="checkpoint"):
        decision.plan_batch(bad)
