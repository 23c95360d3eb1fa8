"""SIGKILL the runtime process at every step of the cycle, with each real sink.

For each sink, one input topic of N records is processed by a sequence of
driver processes (eos_driver.py): each of the first runs SIGKILLs itself at
one kill point (on the second cycle of that run, so something committed
before it), the next run recovers and goes on, and a last run finishes the
input. Then, from the external systems alone:

- every input is in the sink's committed rows exactly once, and in the
  transactional store exactly once (count == N);
- every committed sink batch belongs to a broker transaction that committed
  (journaled by the driver after commitTxn, or committed by recovery), and
  every journaled cycle with rows is committed in the sink;
- recovery resolved the half-committed state: the run after a kill between
  commitTxn and commit2PC committed the stranded txn, the run after a kill
  between preCommit2PC and commitTxn aborted it, and nothing is left prepared;
- on a broker whose read_committed is reliable, the committed output records
  carry exactly the cycles of the committed sink batches.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from semel.eos import SqliteBacking, TransactionalStore

DRIVER = Path(__file__).with_name("eos_driver.py")
N = 40
PER_CYCLE = 2  # kill runs must leave input for the next: 8 runs x 2 cycles x 2 < N

ALL_POINTS = ["after:beginTxn", "after:flush", "after:commitOffsets", "preCommit2PC:sink", "after:commitTxn",
              "commit2PC:sink", "after:commit2PC", "after:storeCommit"]
# The filesystem sink gets every point; the others the three that matter most
# for them, to keep the suite short.
KEY_POINTS = ["after:commitOffsets", "preCommit2PC:sink", "after:commitTxn", "commit2PC:sink"]


# ---------------------------------------------------------------- per-sink setup and readers

def sink_setup(kind, tmp_path, pg_uri=None, s3_endpoint=None, http_url=None):
    """(driver sink config, reader() -> {txn: rows}, pending() -> [txn])"""
    if kind == "filesystem":
        from semel.eos.sinks.filesystem import FileSystemSink
        root = tmp_path / "fs"
        s = FileSystemSink(root)
        return {"kind": kind, "root": str(root)}, s.committed_batches, s.recover
    if kind == "postgres":
        import psycopg

        from semel.eos.sinks.postgres import PostgresSink
        table = f"t_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(pg_uri, autocommit=True) as c:
            c.execute(f"CREATE TABLE {table} (k int, v text, txn_id text)")

        def read():
            with psycopg.connect(pg_uri) as c:
                rows = c.execute(f"SELECT txn_id, k, v FROM {table}").fetchall()
            out: dict = {}
            for t, k, v in rows:
                out.setdefault(t, []).append({"k": k, "v": v})
            return out
        return ({"kind": kind, "uri": pg_uri, "table": table}, read,
                PostgresSink(pg_uri, table, ["k", "v"], name="sink", txn_column="txn_id").recover)
    if kind == "s3":
        import boto3

        from semel.eos.sinks.s3 import S3Sink
        bucket = f"b-{uuid.uuid4().hex[:10]}"
        client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket=bucket)
        s = S3Sink(bucket, client=client)
        return {"kind": kind, "bucket": bucket, "endpoint": s3_endpoint}, s.committed_batches, s.recover
    if kind == "iceberg":
        import pyarrow as pa
        from pyiceberg.catalog.sql import SqlCatalog

        from semel.eos.sinks.iceberg import IcebergSink
        uri, wh = f"sqlite:///{tmp_path}/cat.db", f"file://{tmp_path}/wh"
        cat = SqlCatalog("c", uri=uri, warehouse=wh)
        cat.create_namespace("ns")
        cat.create_table("ns.t", schema=pa.schema([("k", pa.int64()), ("v", pa.string())]))
        s = IcebergSink(cat, "ns.t")
        return ({"kind": kind, "catalog_uri": uri, "warehouse": wh, "table": "ns.t"},
                lambda: IcebergSink(cat, "ns.t").committed_batches(), lambda: IcebergSink(cat, "ns.t").recover())
    if kind == "delta":
        import pyarrow as pa

        from semel.eos.sinks.delta import DeltaSink
        uri = str(tmp_path / "delta")
        schema = pa.schema([("k", pa.int64()), ("v", pa.string()), ("txn", pa.string())])
        s = DeltaSink(uri, schema, txn_column="txn")
        return ({"kind": kind, "uri": uri}, lambda: DeltaSink(uri, schema, txn_column="txn").committed_batches(),
                lambda: DeltaSink(uri, schema, txn_column="txn").recover())
    if kind == "http":
        from semel.eos.sinks.http import HttpSink
        import http.client

        def read():
            host, port = http_url.split("//")[1].split(":")
            c = http.client.HTTPConnection(host, int(port), timeout=10)
            c.request("GET", "/committed")
            data = json.loads(c.getresponse().read())
            c.close()
            return data
        return {"kind": kind, "url": http_url}, read, HttpSink(http_url).recover
    raise ValueError(kind)


# ---------------------------------------------------------------- the scenario

def run_driver(cfg: dict, timeout: float = 120) -> int:
    proc = subprocess.run([sys.executable, str(DRIVER), json.dumps(cfg)], timeout=timeout,
                          capture_output=True, text=True)
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"driver exited {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return proc.returncode


@pytest.fixture
def http_url(tmp_path):
    from semel.eos.sinks.http_server import ReferenceServer
    with ReferenceServer(data_dir=tmp_path / "ref") as s:
        yield s.url


CASES = [("filesystem", ALL_POINTS), ("postgres", KEY_POINTS), ("s3", KEY_POINTS), ("iceberg", KEY_POINTS),
         ("delta", KEY_POINTS), ("http", KEY_POINTS)]


@pytest.mark.parametrize("kind,points", CASES, ids=[c[0] for c in CASES])
def test_sigkill_at_every_step_keeps_every_sink_exactly_once(kind, points, eos_broker, tmp_path, request):
    extra = {}
    if kind == "postgres":
        extra["pg_uri"] = request.getfixturevalue("pg_uri")
    if kind == "s3":
        extra["s3_endpoint"] = request.getfixturevalue("s3_endpoint")
    if kind == "http":
        extra["http_url"] = request.getfixturevalue("http_url")
    sink_cfg, read_committed_rows, pending = sink_setup(kind, tmp_path, **extra)
    tag = uuid.uuid4().hex[:8]
    topics = {"input": f"in_{tag}", "output": f"out_{tag}"}
    eos_broker.create_topics((topics["input"], 1), (topics["output"], 1))
    eos_broker.produce(topics["input"], [str(i).encode() for i in range(N)])
    base = dict(bootstrap=eos_broker.bootstrap, app=f"app_{tag}", instance="0", marker=eos_broker.marker_for(
        f"mark_{tag}"), sink=sink_cfg, store=str(tmp_path / "store.db"), expect=N, per_cycle=PER_CYCLE,
        interval=0.5, journal=str(tmp_path / "journal"), **topics)

    reports = []
    for i, point in enumerate(points + [None]):
        cfg = dict(base, kill_at=point, kill_nth=2, report=str(tmp_path / f"report{i}.json"))
        if point is None:
            # The last run only finishes the input: what is left goes in one cycle (its
            # batches are checked like any other) instead of a dozen commits of two rows.
            cfg["per_cycle"] = N
        rc = run_driver(cfg)
        assert rc == (-signal.SIGKILL if point else 0), f"run {i} (kill at {point}) exited {rc}"
        reports.append((point, json.loads(Path(cfg["report"]).read_text())))

    committed = read_committed_rows()
    check_rows_exactly_once(committed)
    check_batches_match_broker_commits(committed, reports, tmp_path / "journal", base["app"])
    check_recovery_resolved(reports, pending)
    check_store(tmp_path / "store.db")
    if eos_broker.read_committed_reliable:
        check_output_topic(eos_broker, topics["output"], committed)


def check_rows_exactly_once(committed: dict) -> None:
    ks = sorted(r["k"] for rows in committed.values() for r in rows)
    assert ks == list(range(N)), f"sink rows are not exactly the inputs: {ks}"


def cycle_of(txn_id: str) -> int:
    return int(txn_id.rsplit("-", 1)[1])


def check_batches_match_broker_commits(committed: dict, reports, journal: Path, app: str) -> None:
    journaled = {int(x) for x in journal.read_text().split()}
    recovered = {cycle_of(t) for _, r in reports for _, t, d, _o in r["recovery"] if d == "commit"}
    with_rows = {cycle_of(t) for t, rows in committed.items() if rows}
    assert with_rows <= journaled | recovered, (
        f"sink batches {sorted(with_rows - journaled - recovered)} have no committed broker transaction")
    committed_cycles = {cycle_of(t) for t in committed}
    missing = {c for c in journaled if c not in committed_cycles}
    # A journaled cycle whose batch was empty may be absent from readers that
    # only see rows; every journaled cycle that carried rows must be there.
    assert not (missing & with_rows)
    assert all(t.startswith(f"{app}-0-") for t in committed)


def check_recovery_resolved(reports, pending) -> None:
    for (killed_at, _), (_, nxt) in zip(reports, reports[1:]):
        decisions = {(p, d) for p, _t, d, _o in nxt["recovery"]}
        if killed_at == "after:commitTxn":
            assert ("sink", "commit") in decisions and ("store", "commit") in decisions, nxt["recovery"]
        if killed_at == "preCommit2PC:sink":
            assert ("sink", "abort") in decisions and ("store", "abort") in decisions, nxt["recovery"]
        if killed_at == "commit2PC:sink":
            assert ("store", "commit") in decisions, nxt["recovery"]
        assert all(o == "OK" for *_x, o in nxt["recovery"]), nxt["recovery"]
    assert pending() == [], "prepared transactions left after the final run"


def check_store(path: Path) -> None:
    store = TransactionalStore(SqliteBacking(path))
    items = store.items()
    assert store.recover() == []
    assert items.pop("count") == N
    assert items == {f"k{i}": i for i in range(N)}
    store.close()


def check_output_topic(broker, topic: str, committed: dict) -> None:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"verify-{uuid.uuid4().hex[:6]}",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    values, cycles, idle = [], {}, 0
    while idle < 10 and len(values) < N:
        m = c.poll(0.3)
        if m is None or m.error():
            idle += 1
            continue
        values.append(int(m.value()))
        cycles.setdefault(int(dict(m.headers())["cycle"]), []).append(int(m.value()))
    c.close()
    assert sorted(values) == list(range(N))
    sink_cycles = {cycle_of(t): sorted(r["k"] for r in rows) for t, rows in committed.items() if rows}
    assert {k: sorted(v) for k, v in cycles.items()} == sink_cycles
