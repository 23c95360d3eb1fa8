"""Exactly-once consume -> transform -> produce + filesystem sink, on any Kafka-compatible broker.

Every input record (an integer as text) is doubled and written both to an
output topic and, as a JSON row, to a filesystem sink; a transactional state
store keeps a running total. Kill it (even with SIGKILL) at any moment and
start it again: each input shows up exactly once in the output topic (read
with isolation.level=read_committed), in <sink-dir>/committed/ and in the
total.

    python examples/eos_pipeline.py --bootstrap 127.0.0.1:9092 --input numbers --output doubled \\
        --sink-dir /tmp/eos-demo [--marker numbers-ledger] [--interval 1.0]

--marker names a topic with 2 partitions that carries the cycle ledger as
committed offsets; it is needed on brokers that drop offset metadata (Tansu).
"""
from __future__ import annotations

import argparse
import logging
import signal
from pathlib import Path

from semel.eos import EosRuntime, SqliteBacking, TransactionalStore
from semel.eos.kafka import KafkaTxnBackend
from semel.eos.sinks.filesystem import FileSystemSink


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--partitions", type=int, default=1, help="input partitions owned by this instance")
    ap.add_argument("--output", required=True)
    ap.add_argument("--sink-dir", type=Path, required=True)
    ap.add_argument("--marker", default=None)
    ap.add_argument("--app", default="doubler")
    ap.add_argument("--instance", default="0")
    ap.add_argument("--interval", type=float, default=1.0, help="commit interval, seconds (0.1 .. 300)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    args.sink_dir.mkdir(parents=True, exist_ok=True)
    backend = KafkaTxnBackend(args.bootstrap, f"{args.app}-{args.instance}",
                                   [(args.input, p) for p in range(args.partitions)], marker_topic=args.marker)
    store = TransactionalStore(SqliteBacking(args.sink_dir / "state.db"))
    sink = FileSystemSink(args.sink_dir / "sink", name="files")
    runtime = EosRuntime(args.app, args.instance, backend, [sink], store, commit_interval=args.interval)

    report = runtime.start()  # fences older instances, resolves what a crash left prepared
    for action in report.actions:
        print(f"recovered {action.participant} {action.txn_id}: {action.decision}")

    def process(record, ctx):
        n = int(record.value)
        ctx.send(args.output, str(2 * n).encode(), key=record.key)
        ctx.stage("files", {"in": n, "out": 2 * n, "partition": record.partition, "offset": record.offset})
        ctx.store.put("total", ctx.store.get("total", 0) + 2 * n)

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    try:
        runtime.run(process, stop=lambda: bool(stopping))
    except KeyboardInterrupt:
        pass
    finally:
        print(f"total so far (committed): {store.items().get('total', 0)}")
        runtime.close()


if __name__ == "__main__":
    main()
