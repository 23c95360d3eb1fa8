"""Writing a two-phase-commit sink of your own, and testing it the way semel tests its sinks.

The sink below keeps batches in a JSON "ledger" file per txn id (a stand-in
for any external system). `check_sink_contract` drives it through every
promise the runtime relies on (idempotent prepare/commit/abort, invisible
until commit, recovery after a restart), and a short run under
`FaultySink` shows what the commit cycle makes of a sink that fails.

    python examples/eos_custom_sink.py
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from semel.eos import OK, EosRuntime, Fatal, RecordingBroker, RecordingTxnBackend
from semel.eos.sink import TwoPhaseSink
from semel.eos.testing import FaultySink, check_sink_contract


class LedgerFileSink(TwoPhaseSink):
    """<root>/<txn>.json holds {"state": "prepared"|"committed", "rows": [...]}."""

    def __init__(self, root: Path, name: str = "ledger"):
        self.root, self.name, self.timeout = Path(root), name, 10.0
        self.root.mkdir(parents=True, exist_ok=True)
        self.staged: list = []

    def _read(self, txn_id):
        path = self.root / f"{txn_id}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def _write(self, txn_id, doc):
        tmp = self.root / f".{txn_id}.tmp"
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.root / f"{txn_id}.json")  # atomic: a crash leaves the old or the new state

    def stage(self, row):
        self.staged.append(row)

    def prepare(self, txn_id, rows=()):
        batch = self.staged + list(rows)
        if self._read(txn_id) is not None:            # a repeat: already prepared or committed
            return Fatal("repeat prepare with new rows") if batch else OK
        self._write(txn_id, {"state": "prepared", "rows": batch})
        self.staged = []
        return OK

    def commit(self, txn_id):
        doc = self._read(txn_id)
        if doc is None:
            return Fatal(f"{txn_id} was never prepared")
        if doc["state"] != "committed":
            self._write(txn_id, dict(doc, state="committed"))
        return OK

    def abort(self, txn_id):
        self.staged = []
        doc = self._read(txn_id)
        if doc is not None and doc["state"] == "committed":
            return Fatal(f"{txn_id} is committed")
        (self.root / f"{txn_id}.json").unlink(missing_ok=True)
        return OK

    def recover(self):
        return sorted(p.stem for p in self.root.glob("*.json") if json.loads(p.read_text())["state"] == "prepared")

    def committed(self):
        return {p.stem: d["rows"] for p in self.root.glob("*.json")
                if (d := json.loads(p.read_text()))["state"] == "committed"}


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="ledger-sink-"))
    check_sink_contract(lambda: LedgerFileSink(root / "contract"), LedgerFileSink(root / "contract").committed,
                        ["a", "b", "c", "d"])
    print("contract: OK")

    broker = RecordingBroker(inputs=list(range(6)))
    backend = RecordingTxnBackend(broker, "demo-0")
    sink = FaultySink(LedgerFileSink(root / "run"), faults={"prepare": "retryable"}, timeout=None)
    runtime = EosRuntime("demo", "0", backend, [sink], commit_interval=0.1)
    runtime.start()

    def work(ctx):
        for _ in range(3):
            record = backend.poll(0)
            if record is not None:
                ctx.stage("ledger", record.value)
    while broker.position != 6:
        print(runtime.run_cycle(work))
    print("committed batches:", LedgerFileSink(root / "run").committed())


if __name__ == "__main__":
    main()
