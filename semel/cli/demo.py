"""`semel demo`: the crash-proof Spark pipeline (semel.demo): an embedded broker
(or `--bootstrap`), numbers 1..N doubled by a Spark job into demo-output, a
PostgreSQL table and a filesystem sink, the job SIGKILLed `--crashes` times and
restarted, and a read_committed verifier; exit 1 on any duplicate or loss.

`semel demo --broker-only`: the broker round trip and a pair of transactions,
showing what a reader sees under each isolation level."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..launch.process import SemelBroker
from ..client.quiet import quiet_logger
from .main import CliError


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="exactly-once Spark pipeline surviving SIGKILLs, checked end to end")
    p.add_argument("--records", type=int, default=None,
                   help="input numbers 1..N (default 3000; 12 with --broker-only)")
    p.add_argument("--crashes", type=int, default=3, help="how many times the Spark job is SIGKILLed")
    p.add_argument("--rate", type=float, default=60.0, help="input records per second")
    p.add_argument("--seed", type=int, default=None, help="seed for the crash moments")
    p.add_argument("--bootstrap", default=None, help="use this broker (HOST:PORT) instead of an embedded one")
    p.add_argument("--postgres", default=None, help="PostgreSQL URL (default: an embedded pgserver)")
    p.add_argument("--master", default="local[2]", help="Spark master of the job (e.g. spark://HOST:7077)")
    p.add_argument("--data-dir", type=Path, default=None, help="work dir (default: a temp dir)")
    p.add_argument("--broker-only", action="store_true",
                   help="only the broker round trip and a committed/aborted transaction, no Spark")
    p.set_defaults(func=run)


def _read(bootstrap, topic, partitions, isolation, expect):
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo", "isolation.level": isolation,
                  "enable.auto.commit": False, "logger": quiet_logger()})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen, deadline = [], time.monotonic() + 20
    while time.monotonic() < deadline:
        msg = c.poll(0.3)
        if msg is not None and not msg.error():
            seen.append(msg)
        elif len(seen) >= expect:
            break
    c.close()
    return sorted(seen, key=lambda m: (m.partition(), m.offset()))


def _round_trip(console, bootstrap, n) -> bool:
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "logger": quiet_logger()})
    t0 = time.perf_counter()
    accounts = ("alice", "bob", "carol", "dave")  # keys hash to both partitions
    for i in range(1, n + 1):
        producer.produce("numbers", key=accounts[i % 4].encode(), value=str(i).encode(),
                         headers=[("source", b"demo")])
    if producer.flush(30):
        raise CliError("records were not acknowledged within 30 s")
    produced_ms = (time.perf_counter() - t0) * 1000
    seen = _read(bootstrap, "numbers", 2, "read_committed", n)
    table = Table(title=f"1. round trip: {len(seen)}/{n} records back")
    for col in ("partition", "offset", "key", "value", "headers"):
        table.add_column(col)
    for m in seen:
        table.add_row(str(m.partition()), str(m.offset()), m.key().decode(), m.value().decode(),
                      ",".join(f"{k}={v.decode()}" for k, v in m.headers() or []))
    console.print(table)
    console.print(f"   idempotent producer, acks=all: every batch fsynced before its ack ({produced_ms:.0f} ms)")
    return sorted(int(m.value()) for m in seen) == list(range(1, n + 1))


def _transactions(console, bootstrap) -> bool:
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "demo-payments", "logger": quiet_logger()})
    p.init_transactions(30)
    p.begin_transaction()
    for v in ("pay alice 10", "pay bob 20"):
        p.produce("ledger", value=v.encode())
    p.commit_transaction(30)
    p.begin_transaction()
    for v in ("pay mallory 999", "pay eve 500"):
        p.produce("ledger", value=v.encode())
    p.flush(30)
    p.abort_transaction(30)
    committed = [m.value().decode() for m in _read(bootstrap, "ledger", 1, "read_committed", 2)]
    uncommitted = [m.value().decode() for m in _read(bootstrap, "ledger", 1, "read_uncommitted", 4)]
    table = Table(title="2. one committed and one aborted transaction")
    table.add_column("read_committed sees")
    table.add_column("read_uncommitted sees")
    for i in range(max(len(committed), len(uncommitted))):
        table.add_row(committed[i] if i < len(committed) else "", uncommitted[i] if i < len(uncommitted) else "")
    console.print(table)
    return committed == ["pay alice 10", "pay bob 20"] and len(uncommitted) == 4


# What the Spark demo imports, checked before anything starts (the `demo` extra has them all).
DEMO_MODULES = ("pyspark", "pandas", "pyarrow", "psycopg", "confluent_kafka")


def run(args) -> int:
    if args.broker_only:
        return run_broker_only(args)
    from .optional import require
    for module in DEMO_MODULES + (() if args.postgres else ("pgserver",)):
        require(module, "semel demo", extra="demo",
                instead="--postgres URL instead of the embedded pgserver" if module == "pgserver"
                else "--broker-only, which needs none of it")
    from .spark_demo import run_spark_demo
    return run_spark_demo(args)


def run_broker_only(args) -> int:
    from .optional import require
    require("confluent_kafka", "semel demo --broker-only")
    args.records = 12 if args.records is None else args.records
    if args.records < 1:
        raise CliError("--records must be at least 1")
    console = Console()
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="semel-demo-"))
    with SemelBroker(data_dir) as broker:
        console.print(f"[bold]semel broker[/] running on {broker.bootstrap} (data in {data_dir})")
        from ..client import Client
        with Client(broker.bootstrap) as client:
            client.create_topic("numbers", 2)
            client.create_topic("ledger", 1)
        ok_round_trip = _round_trip(console, broker.bootstrap, args.records)
        ok_txn = _transactions(console, broker.bootstrap)
    if ok_round_trip and ok_txn:
        console.print("[green]every record came back exactly once; the aborted transaction stayed invisible "
                      "to read_committed[/]")
        return 0
    console.print("[red]unexpected result: records missing, duplicated or visible when aborted[/]")
    return 1
