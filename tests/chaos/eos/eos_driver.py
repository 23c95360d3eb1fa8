"""A runtime process for the SIGKILL tests: consume -> sink + output topic + store, with a kill point.

    python eos_driver.py CONFIG_JSON

Config keys: bootstrap, app, instance, input, output, marker (or null),
sink ({"kind": ..., kind-specific keys}), store (sqlite path), expect (input
count), per_cycle, interval, kill_at (event name or null), kill_nth (which
occurrence of it in this run), report (path of the JSON report), journal
(path; one line per cycle whose commitTxn returned OK).

Each input record (value = decimal offset) becomes: a row {"k": k, "v": ...}
staged to the sink, an output record with a "cycle" header, and store writes
(k<k> and a running count). The process SIGKILLs itself at the kill point;
otherwise it runs until the committed position reaches `expect` and exits 0.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time


def build_sink(cfg: dict):
    kind = cfg["kind"]
    if kind == "filesystem":
        from semel.eos.sinks.filesystem import FileSystemSink
        return FileSystemSink(cfg["root"], name="sink")
    if kind == "postgres":
        from semel.eos.sinks.postgres import PostgresSink
        return PostgresSink(cfg["uri"], cfg["table"], ["k", "v"], mode=cfg.get("mode", "prepared"), name="sink",
                            txn_column="txn_id")
    if kind == "s3":
        from semel.eos.sinks.s3 import S3Sink
        return S3Sink(cfg["bucket"], name="sink", endpoint_url=cfg["endpoint"], region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    if kind == "iceberg":
        from pyiceberg.catalog.sql import SqlCatalog

        from semel.eos.sinks.iceberg import IcebergSink
        cat = SqlCatalog("c", uri=cfg["catalog_uri"], warehouse=cfg["warehouse"])
        return IcebergSink(cat, cfg["table"], name="sink")
    if kind == "delta":
        import pyarrow as pa

        from semel.eos.sinks.delta import DeltaSink
        schema = pa.schema([("k", pa.int64()), ("v", pa.string()), ("txn", pa.string())])
        return DeltaSink(cfg["uri"], schema, name="sink", txn_column="txn")
    if kind == "http":
        from semel.eos.sinks.http import HttpSink
        return HttpSink(cfg["url"], name="sink")
    raise SystemExit(f"unknown sink kind {kind!r}")


def main() -> int:
    cfg = json.loads(sys.argv[1])
    from semel.eos import EosRuntime, SqliteBacking, TransactionalStore
    from semel.eos.kafka import KafkaTxnBackend
    from semel.eos.outcomes import CommitSucceeded

    seen: dict[str, int] = {}

    def on_event(name: str) -> None:
        if name == cfg.get("kill_at"):
            seen[name] = seen.get(name, 0) + 1
            if seen[name] == cfg.get("kill_nth", 1):
                os.kill(os.getpid(), signal.SIGKILL)
        if name == "after:commitTxn":
            with open(cfg["journal"], "a") as j:
                j.write(f"{rt.next_cycle}\n")
                j.flush()
                os.fsync(j.fileno())

    backend = KafkaTxnBackend(cfg["bootstrap"], f"{cfg['app']}-{cfg['instance']}", [(cfg["input"], 0)],
                             marker_topic=cfg.get("marker"), timeout=30)
    store = TransactionalStore(SqliteBacking(cfg["store"]))
    rt = EosRuntime(cfg["app"], cfg["instance"], backend, [build_sink(cfg["sink"])], store,
                    commit_interval=cfg.get("interval", 0.5), on_event=on_event)
    report = rt.start()
    out = {"recovery": [[a.participant, a.txn_id, str(a.decision), repr(a.outcome)] for a in report.actions],
           "next_cycle": report.next_cycle, "cycles": []}
    _write(cfg["report"], out)

    def work(ctx) -> None:
        done = 0
        while done < cfg["per_cycle"] and time.monotonic() < ctx.deadline:
            rec = backend.poll(0.05)
            if rec is None:
                continue
            k = int(rec.value)
            ctx.send(cfg["output"], rec.value, headers=[("cycle", str(ctx.cycle).encode())])
            ctx.stage("sink", {"k": k, "v": f"value-{k}"})
            store.put(f"k{k}", k)
            store.put("count", store.get("count", 0) + 1)
            done += 1

    for _ in range(cfg.get("max_cycles", 200)):
        outcome = rt.run_cycle(work)
        out["cycles"].append([outcome.cycle, outcome.kind, str(getattr(outcome, "step", ""))])
        _write(cfg["report"], out)
        if outcome.kind == "fatal":
            return 3
        if isinstance(outcome, CommitSucceeded) and backend.positions[(cfg["input"], 0)] >= cfg["expect"]:
            rt.close()
            return 0
    return 4


def _write(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
