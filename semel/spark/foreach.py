"""Exactly-once external sinks from Spark: `foreach_batch` runs every micro-batch as
one commit cycle of the eos runtime (semel.eos.cycle), for the two-phase-commit
sinks of semel.eos.sinks (PostgreSQL, filesystem, S3, Iceberg, Delta, HTTP):

    beginTxn -> flush -> commitOffsets -> preCommit2PC -> commitTxn -> commit2PC -> storeCommit

    fn = foreach_batch(rows, sinks=[PostgresSink(uri, "t", ["k", "v"])],
                       bootstrap="host:9092", checkpoint="/ck/q1")
    df.writeStream.foreachBatch(fn).option("checkpointLocation", "/ck/q1").start()

`rows(df, batch_id)` turns the batch DataFrame into rows per sink name
({"postgres": [...]}); those rows travel through the driver (collect), so this
path suits outputs a driver can hold per batch. Kafka output belongs in
`format("semel")` instead, whose rows never leave the executors.

The broker transaction of cycle c = batch_id + 1 is the query's parent
transaction P = "semel-spark-{group}" (InitProducerId fences a zombie run), and
it commits the batch's source end offsets (the checkpoint's offset log) under the
query's group with the eos ledger ("semel-eos/1 t=P c=<cycle> h=<hold>") as
metadata: that commit is the decision. Sinks prepare before it and commit after
it under the stable id "{app}-{instance}-{cycle}". At the first batch of a process
(a start or restart) eos recovery decides every prepared sink transaction from
the ledger: commit the one the broker committed, abort the rest. A batch whose
cycle the ledger already holds (Spark replays it after a crash between the
decision and its commit log) is not run again. Any failure fails the query with
the cycle's outcome; a restart replays the batch.
"""
from __future__ import annotations

import hashlib
from typing import Any, Callable, Mapping, Sequence

from semel.backoff import Backoff
from semel.client import txn as wire
from semel.client.client import ClientError
from semel.client.cluster import COORDINATOR_MOVED, GROUP
from semel.eos.backend import BackendError, TxnBackend
from semel.eos.cycle import CycleParts, run_commit_cycle
from semel.eos.ledger import Ledger
from semel.eos.outcomes import CommitSucceeded
from semel.eos.recovery import recover
from semel.eos.sink import SinkGuard
from semel.eos.txnid import SinkTxnId
from semel.protocol.errors import KafkaError
from semel.spark import options as opt
from semel.spark import sink as spark_sink
from semel.spark import decision as spark_decision
from semel.spark import routing
from semel.spark import sink_options
from semel.spark.checkpoint import session_settings

Rows = Callable[[Any, int], Mapping[str, Sequence[Any]]]


class BatchFailed(Exception):
    """A micro-batch's commit cycle did not commit; the message is the cycle's outcome."""


class SparkBatchBackend(TxnBackend):
    """The cycle's broker side over the query's parent transaction (standard Kafka APIs)."""

    def __init__(self, o: sink_options.SinkOptions):
        self.o = o
        self.transactional_id = o.parent
        self.batch = 0
        self._st: wire.TxnState | None = None

    def _client(self):
        return routing.connect(self.o)

    def _marks(self) -> tuple[dict, list]:
        offsets = spark_decision.batch_offsets(self.o, self.batch)
        parts = spark_decision.decision_partitions(self.o, offsets)
        return offsets, parts

    def init(self) -> None:
        pass  # InitProducerId at every beginTxn: each batch's commit() may run in a new worker

    def read_ledger(self) -> Ledger | None:
        """UNSTABLE_OFFSET_COMMIT: a parent transaction of a crashed run is open (none of
        ours is, between cycles). It never got its decision, so fence it (the broker
        aborts it) rather than wait out its timeout (semel.restartWindowMs)."""
        _, parts = self._marks()
        pace = Backoff(self.o.request_timeout_ms / 1000)
        with self._client() as r:
            while True:
                try:
                    got = wire.committed_with_metadata(routing.group_coordinator(r, self.o), self.o.group, parts)
                    break
                except ClientError as exc:
                    moved = r.seen(exc.error, coordinator=(self.o.group, GROUP)) in COORDINATOR_MOVED
                    if not (moved or exc.error == KafkaError.UNSTABLE_OFFSET_COMMIT) or pace.expired():
                        raise
                    if not moved:
                        routing.init_transaction_or_error(r, self.o, self.o.parent)
                    pace.wait()
        if all(off < 0 for off, _ in got.values()):
            return Ledger(0)
        ledgers = [Ledger.decode(meta, self.o.parent) for off, meta in got.values() if off >= 0]
        found = [x for x in ledgers if x is not None]
        return max(found, key=lambda x: x.committed) if found else None

    def begin_txn(self, cycle: int) -> None:
        with self._client() as r:
            err, st = routing.init_transaction_or_error(r, self.o, self.o.parent)
        self._check("beginTxn", err)
        self._st = st

    def flush(self, cycle: int) -> None:
        pass  # nothing is produced on the broker side: the rows go to the external sinks

    def commit_offsets(self, cycle: int, ledger: Ledger) -> None:
        offsets, parts = self._marks()
        marks = offsets or {tp: cycle for tp in parts}
        st, o = self._st, self.o
        with self._client() as r:   # AddOffsetsToTxn to the parent's coordinator, TxnOffsetCommit to the group's
            self._check("commitOffsets", routing.retrying(o, "AddOffsetsToTxn", lambda: routing.on_txn_coordinator(
                r, o, o.parent, lambda c: wire.add_offsets(c, st, o.group))))
            errs = wire.txn_offset_commit(routing.group_coordinator(r, o), st, o.group, marks, ledger.encode(o.parent))
        for err in errs.values():
            self._check("commitOffsets", err)

    def commit_txn(self, cycle: int) -> None:
        self._end(True)

    def abort_txn(self, cycle: int) -> None:
        self._end(False)

    def _end(self, commit: bool) -> None:
        st = self._st
        with self._client() as r:
            err = routing.retrying(self.o, "EndTxn",
                                    lambda: routing.end_transaction(r, self.o, st.txn_id, st.pid, st.epoch, commit))
        self._check("commitTxn" if commit else "abortTxn", err)

    @staticmethod
    def _check(op: str, err: KafkaError) -> None:
        if err != KafkaError.NONE:
            raise BackendError(op, err.name, code=err)


def app_name(group: str) -> str:
    """An eos app id (letters, digits, '_', '.') for the query's group."""
    return "spark_" + hashlib.sha256(group.encode()).hexdigest()[:16]


def foreach_batch(rows: Rows, *, sinks: Sequence[Any], bootstrap: str, checkpoint: str | None = None,
                  query_id: str | None = None, topic: str | None = None, app_id: str | None = None,
                  instance_id: str = "0", restart_window_ms: int = sink_options.DEFAULT_RESTART_WINDOW_MS,
                  request_timeout_ms: int = 30_000,
                  options: Mapping[str, str] | None = None) -> Callable[[Any, int], None]:
    """The function for `writeStream.foreachBatch(...)`. `checkpoint`: the query's
    checkpointLocation (identity and the batch's source offsets, read on the driver with the
    active session's `spark.hadoop.fs.*` settings); `query_id` when
    there is none; `topic`: a partition to record the decision on when the query
    has no semel source; `options`: more of the sink's options, e.g. the
    `kafka.security.protocol` / `kafka.sasl.*` / `kafka.ssl.*` ones of a secured broker."""
    options = {**opt.lower(options or {}), opt.BOOTSTRAP: bootstrap, opt.RESTART_WINDOW: str(restart_window_ms),
               opt.REQUEST_TIMEOUT: str(request_timeout_ms)}
    for name, value in ((opt.CHECKPOINT, checkpoint), (opt.QUERY_ID, query_id), (opt.TOPIC, topic)):
        if value:
            options[name] = value
    # the driver reads the checkpoint (each batch's offsets) with the session's fs.* settings
    o = spark_sink.parse_options(options, session_settings())
    backend = SparkBatchBackend(o)
    guards = [SinkGuard(s) for s in sinks]
    app = app_id or app_name(o.group)
    state: dict[str, Any] = {}

    def run(df, batch_id: int) -> None:
        batch_id = int(batch_id)
        backend.batch = batch_id
        cycle = batch_id + 1  # cycle 0 means "none ever" in the ledger
        ledger = backend.read_ledger()
        if "hold" not in state:  # the first batch of this process: resolve what a crash left prepared
            state["hold"] = recover(app, instance_id, ledger, guards).hold
        if ledger is not None and ledger.committed >= cycle:
            return  # decided before a crash: Spark replays it, the sinks already have it
        batch_rows = rows(df, batch_id)
        txn_id = str(SinkTxnId(app, instance_id, cycle))
        parts = CycleParts(backend=backend, sinks=guards, hold=state["hold"],
                           rows_for=lambda _txn, name: batch_rows.get(name, ()))
        outcome = run_commit_cycle(cycle, txn_id, parts)
        if not isinstance(outcome, CommitSucceeded):
            raise BatchFailed(f"semel foreach_batch: batch {batch_id} did not commit: {outcome}")

    return run
