"""Commit-cycle overhead per sink, at commit intervals of 100 ms and 30 s.

A cycle's overhead is the time from the end of processing (after the flush
step) to the end of the cycle: commitOffsets, preCommit2PC, commitTxn,
commit2PC and storeCommit. What a sink costs depends on the batch it gets,
so the input is modelled as a steady stream of `--rate` rows/s: a 100 ms
cycle carries rate*0.1 rows, a 30 s cycle rate*30 rows. The rows are staged
instantly (the benchmark does not sleep through 30 s intervals), so only
the commit work is timed.

Two backends:
- "recording" (in-memory broker model) isolates the sink's own cost;
- "kafka" (KafkaTxnBackend on a Tansu broker process, memory sink) is the
  broker-transaction cost: begin, TxnOffsetCommit, EndTxn.

Every real component is started here (Tansu, pgserver, moto_server, the HTTP
reference server) on loopback and stopped afterwards.

    python bench/eos_bench.py [--quick] [--rate 1000] [--cycles 5] [--sinks memory,filesystem,...]

Results: bench/results/eos.json (eos-quick.json with --quick).
"""
from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, write_result  # noqa: E402
from semel.eos import EosRuntime, RecordingBroker, RecordingTxnBackend, SqliteBacking, TransactionalStore  # noqa: E402
from semel.eos.outcomes import CommitSucceeded  # noqa: E402

INTERVALS = (0.1, 30.0)
ALL_SINKS = ("memory", "filesystem", "http", "postgres_prepared", "postgres_table", "s3", "iceberg", "delta",
             "kafka+memory")


# ---------------------------------------------------------------- components

class Components(contextlib.ExitStack):
    """Starts the external systems lazily, stops them all on exit."""

    def __init__(self, tmp: Path):
        super().__init__()
        self.tmp = tmp
        self._pg = self._s3 = self._http = self._tansu = None

    def pg(self) -> str:
        if self._pg is None:
            import pgserver
            from pgserver._commands import pg_ctl
            pgdata = Path(tempfile.mkdtemp(prefix="semel-eos-bench-pg-"))
            srv = pgserver.get_server(pgdata, cleanup_mode="stop")
            srv.psql("ALTER SYSTEM SET max_prepared_transactions = 20;")
            pg_ctl(["-w", "restart"], pgdata=srv.pgdata, user=srv.system_user, timeout=60)

            def stop():
                with contextlib.suppress(Exception):
                    pg_ctl(["-w", "stop", "-m", "fast"], pgdata=srv.pgdata, user=srv.system_user, timeout=60)
                srv.cleanup()
                shutil.rmtree(pgdata, ignore_errors=True)
            self.callback(stop)
            self._pg = srv.get_uri()
        return self._pg

    def s3(self):
        if self._s3 is None:
            import boto3

            from semel.launch.process import free_port, wait_for_port
            port = free_port()
            proc = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p",
                                     str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
            self.callback(lambda: (proc.kill(), proc.wait(10)))
            wait_for_port("127.0.0.1", port, 60, proc)
            self._s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                                    aws_access_key_id="bench", aws_secret_access_key="bench")
        return self._s3

    def http(self) -> str:
        if self._http is None:
            from semel.eos.sinks.http_server import ReferenceServer
            server = ReferenceServer(data_dir=self.tmp / "http").start()
            self.callback(server.stop)
            self._http = server.url
        return self._http

    def tansu(self):
        if self._tansu is None:
            from semel.launch.process import TansuBroker
            b = TansuBroker()
            b.start()
            self.callback(b.close)
            self._tansu = b
        return self._tansu


def make_sink(kind: str, c: Components):
    tag = uuid.uuid4().hex[:8]
    if kind in ("memory", "kafka+memory"):
        from semel.eos.sinks.memory import MemorySink
        return MemorySink("sink")
    if kind == "filesystem":
        from semel.eos.sinks.filesystem import FileSystemSink
        return FileSystemSink(c.tmp / f"fs-{tag}", name="sink")
    if kind == "http":
        from semel.eos.sinks.http import HttpSink
        return HttpSink(c.http(), name="sink")
    if kind.startswith("postgres"):
        import psycopg

        from semel.eos.sinks.postgres import PostgresSink
        mode = kind.split("_")[1]
        with psycopg.connect(c.pg(), autocommit=True) as conn:
            conn.execute(f"CREATE TABLE t_{tag} (k bigint, v text, txn_id text, pending boolean)")
        return PostgresSink(c.pg(), f"t_{tag}", ["k", "v"], mode=mode, name="sink", txn_column="txn_id")
    if kind == "s3":
        from semel.eos.sinks.s3 import S3Sink
        client = c.s3()
        client.create_bucket(Bucket=f"b-{tag}")
        return S3Sink(f"b-{tag}", client=client, name="sink")
    if kind == "iceberg":
        import pyarrow as pa
        from pyiceberg.catalog.sql import SqlCatalog

        from semel.eos.sinks.iceberg import IcebergSink
        d = c.tmp / f"ice-{tag}"
        d.mkdir()
        cat = SqlCatalog("b", uri=f"sqlite:///{d}/cat.db", warehouse=f"file://{d}")
        cat.create_namespace("ns")
        cat.create_table("ns.t", schema=pa.schema([("k", pa.int64()), ("v", pa.string())]))
        return IcebergSink(cat, "ns.t", name="sink")
    if kind == "delta":
        import pyarrow as pa

        from semel.eos.sinks.delta import DeltaSink
        return DeltaSink(str(c.tmp / f"delta-{tag}"), pa.schema([("k", pa.int64()), ("v", pa.string())]),
                         name="sink")
    raise ValueError(f"unknown sink {kind!r}; known: {', '.join(ALL_SINKS)}")


def make_backend(kind: str, c: Components, app: str):
    if kind != "kafka+memory":
        return RecordingTxnBackend(RecordingBroker(), f"{app}-0")
    from confluent_kafka.admin import AdminClient, NewTopic

    from semel.eos.kafka import KafkaTxnBackend
    broker = c.tansu()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.create_topics([NewTopic(f"in_{app}", 1, 1), NewTopic(f"mark_{app}", 2, 1)]).values():
        f.result(30)
    # Tansu drops offset metadata: the marker topic carries the ledger.
    return KafkaTxnBackend(broker.bootstrap, f"{app}-0", [(f"in_{app}", 0)], marker_topic=f"mark_{app}")


# ---------------------------------------------------------------- measurement

def measure(kind: str, interval: float, rate: int, cycles: int, c: Components) -> dict:
    rows = max(1, int(rate * interval))
    app = f"bench_{uuid.uuid4().hex[:6]}"
    marks: dict[str, float] = {}
    rt = EosRuntime(app, "0", make_backend(kind, c, app), [make_sink(kind, c)],
                    TransactionalStore(SqliteBacking(c.tmp / f"{app}.db")), commit_interval=interval,
                    on_event=lambda name: marks.__setitem__(name, time.perf_counter()))
    rt.start()
    counter = [0]

    def work(ctx):
        base = counter[0]
        for i in range(rows):
            ctx.stage("sink", {"k": base + i, "v": f"row-{base + i}"})
        ctx.store.put("last", base + rows)
        counter[0] += rows

    samples = []
    for n in range(cycles + 1):
        outcome = rt.run_cycle(work)
        if not isinstance(outcome, CommitSucceeded):
            raise RuntimeError(f"{kind}: cycle failed: {outcome}")
        if n == 0:
            continue  # warm-up: connections, table metadata, imports
        samples.append({
            "overhead_s": marks["after:storeCommit"] - marks["after:flush"],
            "pre_commit_s": marks["after:preCommit2PC"] - marks["before:preCommit2PC"],
            "commit_txn_s": marks["after:commitTxn"] - marks["before:commitTxn"],
            "commit_2pc_s": marks["after:commit2PC"] - marks["before:commit2PC"],
        })
    rt.close()
    med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
    return {
        "sink": kind, "commit_interval_s": interval, "rows_per_cycle": rows, "cycles": cycles,
        "overhead_median_ms": round(med["overhead_s"] * 1000, 3),
        "overhead_max_ms": round(max(s["overhead_s"] for s in samples) * 1000, 3),
        "prepare_median_ms": round(med["pre_commit_s"] * 1000, 3),
        "commit_txn_median_ms": round(med["commit_txn_s"] * 1000, 3),
        "commit_2pc_median_ms": round(med["commit_2pc_s"] * 1000, 3),
        "overhead_fraction_of_interval": round(med["overhead_s"] / interval, 5),
        "overhead_per_row_us": round(med["overhead_s"] / rows * 1e6, 3),
    }


def run(out_dir: Path = RESULTS, quick: bool = False, rate: int = 1000, cycles: int = 5,
        sinks: tuple[str, ...] = ALL_SINKS) -> Path:
    if quick:
        cycles = min(cycles, 2)
    rows = []
    with tempfile.TemporaryDirectory(prefix="semel-eos-bench-") as tmp, Components(Path(tmp)) as comps:
        for kind in sinks:
            for interval in INTERVALS:
                row = measure(kind, interval, rate, cycles, comps)
                print(f"{kind:18} interval={interval:>5}s rows={row['rows_per_cycle']:>6} "
                      f"overhead={row['overhead_median_ms']:>9.2f} ms ({row['overhead_fraction_of_interval']:.2%} "
                      f"of the interval, {row['overhead_per_row_us']:.1f} us/row)", flush=True)
                rows.append(row)
    return write_result(out_dir, "eos-quick" if quick else "eos", {
        "what": "commit-cycle overhead (commitOffsets..storeCommit) per sink; batch = rate x interval",
        "rate_rows_per_s": rate, "intervals_s": list(INTERVALS),
        "store": "TransactionalStore on SqliteBacking in every run",
        "notes": "recording backend except kafka+memory (KafkaTxnBackend on Tansu 0.6, marker-topic ledger); "
                 "median of the measured cycles after one warm-up cycle",
        "rows": rows})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rate", type=int, default=1000, help="input rows per second (batch = rate x interval)")
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--sinks", default=",".join(ALL_SINKS))
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    sinks = tuple(s for s in args.sinks.split(",") if s)
    unknown = set(sinks) - set(ALL_SINKS)
    if unknown:
        ap.error(f"unknown sinks {sorted(unknown)}; known: {', '.join(ALL_SINKS)}")
    if args.rate <= 0 or args.cycles <= 0:
        ap.error("--rate and --cycles must be positive")
    print(run(args.out, args.quick, args.rate, args.cycles, sinks))


if __name__ == "__main__":
    main()
