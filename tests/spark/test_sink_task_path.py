"""What a format("semel") task costs a Python worker beyond its rows, against a real broker:
a fresh interpreter with what a Spark worker has loaded (pyspark's worker modules,
pyarrow) unpickles the sink's writer and writes three tasks' branches, as one reused
worker would. It imports no pandas (pyarrow's to_numpy() would: a quarter second per
worker) and no HTTP stack; the tasks after the first open no connection and ask no route again
(ApiVersions, Metadata, FindCoordinator), and each takes two writes to the broker:
the decided-yet check with the branch's InitProducerId, then the join, the rows and
the re-check."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
from pyspark import cloudpickle

from semel.spark import sink
from semel.spark.decision import BatchPlan
from tests.spark.test_source import create

# Deferred until something asks for them: never on a sink task's path.
DEFERRED = ("pandas", "urllib.request")

_TASKS = """
import json, pickle, sys
import pyspark.worker, pyspark.sql.datasource, pyarrow as pa
from pyspark.sql.pandas.serializers import ArrowStreamSerializer

writer, stream = pickle.loads(sys.stdin.buffer.read())
rb = pa.ipc.open_stream(stream).read_next_batch()   # as a worker reads its input
from semel.client.client import Client
from semel.spark.branch_writer import ArrowInput, write_branch
from semel.spark.decision import decision_partitions

writes = []   # per task: the api keys of each write to a broker
send_many, call = Client.send_many, Client._call
Client.send_many = lambda self, calls: (writes[-1].append([int(k) for k, _ in calls]), send_many(self, calls))[1]
Client._call = lambda self, key, *a: (writes[-1].append([int(key)]), call(self, key, *a))[1]
rows = []
for partition in range(3):
    writes.append([])
    m = write_branch(writer.o, writer.cols, ArrowInput(iter([rb])), 5, partition, 0,
                     parts=decision_partitions(writer.o, writer.plan.offsets))
    rows.append(m.rows)
print(json.dumps({"rows": rows, "writes": writes,
                  "modules": sorted(sys.modules)}))
"""


def test_a_task_imports_no_pandas_and_reuses_its_worker_connection(spark_broker):
    bs = spark_broker.bootstrap
    create(bs, "tp-out", 2)
    o = sink.probe(sink.parse_options({"kafka.bootstrap.servers": bs, "topic": "tp-out",
                                       "semel.query.id": "task-path"}))
    writer = sink.SemelStreamWriter(o, {"key": 0, "value": 1}, BatchPlan())
    rb = pa.record_batch([pa.array([b"k1", b"k2"]), pa.array([b"v1", b"v2"])], names=["key", "value"])
    stream = pa.BufferOutputStream()
    with pa.ipc.new_stream(stream, rb.schema) as w:
        w.write_batch(rb)
    out = subprocess.run([sys.executable, "-c", _TASKS], input=cloudpickle.dumps((writer, stream.getvalue().to_pybytes())),
                         capture_output=True, env=os.environ, timeout=120)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    got = json.loads(out.stdout)
    assert got["rows"] == [2, 2, 2]
    loaded = set(got["modules"])
    assert [m for m in DEFERRED if m in loaded] == []
    # ApiVersions 18, Metadata 3, FindCoordinator 10: the first task's only
    routes = {18, 3, 10}
    assert any(k in routes for w in got["writes"][0] for k in w)
    for task in got["writes"][1:]:
        assert len(task) == 2 and not routes & {k for w in task for k in w}
        assert task[0] == [9, 22]        # OffsetFetch (decided yet?), InitProducerId
        assert task[1] == [24, 0, 9]     # AddPartitionsToTxn, Produce, OffsetFetch (decided meanwhile?)
