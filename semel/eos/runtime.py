"""The exactly-once runtime: recovery at start, then commit cycles at a cadence.

    rt = EosRuntime("orders", "0", KafkaTxnBackend(...), sinks=[FileSystemSink(...)],
                    commit_interval=5.0)
    rt.start()                      # fence, read the ledger, resolve stranded txns
    rt.run(process)                 # consume -> process -> produce/stage, forever

`process(record, ctx)` is application code: it may `ctx.send(topic, value)`
(records in the broker transaction), `ctx.stage(sink_name, row)` (rows for a
sink) and read/write `ctx.store` (the transactional state store). Everything it
does in one cycle commits together or not at all.

After CommitFatal the runtime refuses further cycles (`RuntimeFailed`): the
process should exit; the next start's recovery resolves what was left.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable, Sequence

from semel.eos.backend import Record, TxnBackend
from semel.eos.cycle import CycleParts, run_commit_cycle
from semel.eos.metrics import EosMetrics
from semel.eos.outcomes import CommitAborted, CommitFatal, CommitSucceeded, CycleOutcome, Ok, Step
from semel.eos.recovery import RecoveryReport, recover
from semel.eos.sink import SinkGuard
from semel.eos.store import TransactionalStore
from semel.eos.txnid import SinkTxnId, check_name

log = logging.getLogger("semel.eos")

MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 300.0
DEFAULT_INTERVAL_S = 30.0


def _retry_aborts(participants: Sequence[SinkGuard], pending: dict[str, set[str]]) -> bool:
    """Retry failed aborts in place; True if none is left."""
    by_name = {g.name: g for g in participants}
    for name, txn_ids in list(pending.items()):
        for txn_id in sorted(txn_ids):
            if isinstance(by_name[name].abort(txn_id, step="abort-retry"), Ok):
                txn_ids.discard(txn_id)
        if not txn_ids:
            del pending[name]
    return not pending


class RuntimeFailed(Exception):
    """Raised when a cycle is asked of a runtime that is not started or has failed."""

    def __init__(self, message: str, outcome: CycleOutcome | None = None):
        super().__init__(message)
        self.outcome = outcome


def check_interval(seconds: object) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds != seconds:
        raise ValueError(f"commit_interval must be a number of seconds, got {seconds!r}")
    if not MIN_INTERVAL_S <= seconds <= MAX_INTERVAL_S:
        raise ValueError(f"commit_interval must be between {MIN_INTERVAL_S} and {MAX_INTERVAL_S} s, "
                         f"got {seconds}")
    return float(seconds)


class CycleContext:
    """What application code sees during one cycle."""

    def __init__(self, runtime: "EosRuntime", cycle: int, txn_id: str, deadline: float):
        self._rt = runtime
        self.cycle = cycle
        self.txn_id = txn_id
        self.deadline = deadline
        self.store = runtime.store

    def send(self, topic: str, value: bytes | None, key: bytes | None = None, partition: int | None = None,
             headers: Iterable | None = None) -> None:
        self._rt.backend.produce(topic, value, key=key, partition=partition, headers=headers)

    def stage(self, sink_name: str, row: Any) -> None:
        guard = self._rt.sinks_by_name.get(sink_name)
        if guard is None:
            raise KeyError(f"no sink named {sink_name!r}; known: {', '.join(self._rt.sinks_by_name) or '-'}")
        guard.sink.stage(row)


class EosRuntime:
    def __init__(self, app_id: str, instance_id: str, backend: TxnBackend,
                 sinks: Sequence[Any] = (), store: TransactionalStore | None = None, *,
                 commit_interval: float = DEFAULT_INTERVAL_S, metrics: EosMetrics | None = None,
                 rows_for: Callable[[str, str], Sequence[Any]] | None = None,
                 on_event: Callable[[str], None] | None = None, first_cycle: int | None = None):
        self.app_id = check_name("app_id", app_id)
        self.instance_id = check_name("instance_id", instance_id)
        self.backend = backend
        self.commit_interval = check_interval(commit_interval)
        backend.expect_interval(self.commit_interval)
        self.metrics = metrics if metrics is not None else EosMetrics()
        self.store = store
        self.rows_for = rows_for
        self.on_event = on_event
        self.first_cycle = first_cycle
        self.sinks = [self._guard(s) for s in sinks]
        self.sinks_by_name = {g.name: g for g in self.sinks}
        if len(self.sinks_by_name) != len(self.sinks):
            raise ValueError(f"sink names must be unique, got {[g.name for g in self.sinks]}")
        if store is not None and "store" in self.sinks_by_name:
            raise ValueError("the name 'store' is taken by the state store")
        self.store_guard = self._guard(store) if store is not None else None
        self.next_cycle: int | None = None
        self.hold = 0
        self.failed: CommitFatal | None = None
        self.report: RecoveryReport | None = None
        # aborts that failed (participant name -> txn ids), retried before each cycle:
        # left over from recovery (best effort) / failed in this process (must succeed)
        self._pending_aborts: dict[str, set[str]] = {}
        self._dirty: dict[str, set[str]] = {}

    def _guard(self, participant: Any) -> SinkGuard:
        return SinkGuard(participant, on_latency=self.metrics.sink_latency, on_failure=self.metrics.sink_failure)

    @property
    def participants(self) -> list[SinkGuard]:
        return ([self.store_guard] if self.store_guard is not None else []) + self.sinks

    # ------------------------------------------------------------ start
    def start(self) -> RecoveryReport:
        """Fence older instances, then resolve stranded transactions. Raises RecoveryError."""
        self.backend.init()  # completes or aborts the previous instance's transaction first
        ledger = self.backend.read_ledger()
        report = recover(self.app_id, self.instance_id, ledger, self.participants, self.metrics,
                         first_cycle=self.first_cycle)
        for name, txn_id in report.failed_aborts:
            self._pending_aborts.setdefault(name, set()).add(txn_id)
        self.report, self.next_cycle, self.hold = report, report.next_cycle, report.hold
        if ledger is not None:
            self.metrics.last_committed_cycle.set(ledger.committed)
        log.info("eos start app=%s instance=%s ledger=%s next_cycle=%d recovered=%d", self.app_id,
                 self.instance_id, ledger, self.next_cycle, len(report.actions))
        return report

    # ------------------------------------------------------------ cycles
    def txn_id(self, cycle: int) -> str:
        return str(SinkTxnId(self.app_id, self.instance_id, cycle))

    def run_cycle(self, work: Callable[[CycleContext], Any] | None = None) -> CycleOutcome:
        """Run one commit cycle; `work(ctx)` is the processing inside its flush step."""
        if self.failed is not None:
            raise RuntimeFailed("runtime stopped after CommitFatal; restart the process", self.failed)
        if self.next_cycle is None:
            raise RuntimeFailed("call start() before running cycles")
        cycle = self.next_cycle
        txn_id = self.txn_id(cycle)
        not_clean = self._clean_participants()
        if not_clean is not None:
            # Part of beginning the transaction in every participant: one that
            # cannot be reset would carry rows of an aborted cycle into this one.
            outcome: CycleOutcome = CommitFatal(cycle, txn_id, Step.BEGIN_TXN, not_clean[0], not_clean[1])
            log.error("eos cycle=%d txn=%s outcome=CommitFatal step=%s: %s", cycle, txn_id, Step.BEGIN_TXN,
                      not_clean[0])
            self.metrics.cycle_done(outcome.kind, str(Step.BEGIN_TXN), 0.0)
        else:
            ctx = CycleContext(self, cycle, txn_id, time.monotonic() + self.commit_interval)
            parts = CycleParts(self.backend, self.sinks, self.store_guard,
                               work=(lambda: work(ctx)) if work is not None else None, rows_for=self.rows_for,
                               on_event=self.on_event, hold=self.hold, metrics=self.metrics)
            outcome = run_commit_cycle(cycle, txn_id, parts)
        # Every attempt uses a fresh number, so an aborted id is never reused in this process.
        self.next_cycle = cycle + 1
        if isinstance(outcome, CommitSucceeded):
            self.metrics.last_committed_cycle.set(cycle)
        elif isinstance(outcome, CommitAborted):
            for name in outcome.stranded:
                self._dirty.setdefault(name, set()).add(txn_id)
        elif isinstance(outcome, CommitFatal):
            self.failed = outcome
        return outcome

    def run(self, process: Callable[[Record, CycleContext], Any], *, stop: Callable[[], bool] | None = None,
            max_cycles: int | None = None, poll_timeout: float = 0.05) -> CycleOutcome | None:
        """Consume-process-commit loop until stop() or max_cycles; raises RuntimeFailed on CommitFatal."""
        outcome = None
        done = 0
        while not (stop is not None and stop()) and (max_cycles is None or done < max_cycles):
            outcome = self.run_cycle(lambda ctx: self._consume_until(ctx, process, poll_timeout, stop))
            done += 1
            if isinstance(outcome, CommitFatal):
                raise RuntimeFailed(f"CommitFatal at {outcome.step}: {outcome.reason}", outcome)
        return outcome

    def _consume_until(self, ctx: CycleContext, process, poll_timeout: float, stop) -> None:
        while True:
            remaining = ctx.deadline - time.monotonic()
            if remaining <= 0 or (stop is not None and stop()):
                return
            record = self.backend.poll(min(remaining, poll_timeout))
            if record is not None:
                process(record, ctx)

    def _clean_participants(self) -> tuple[str, tuple[str, ...]] | None:
        """Make every participant ready for a new cycle; (reason, names) if one is not."""
        stuck = tuple(g.name for g in self.participants if g.stuck)
        if stuck:
            return f"a timed-out call is still running in {', '.join(stuck)}", stuck
        # Aborts that failed in this process: the sink may still hold staged
        # rows of that cycle in memory, so they must succeed now.
        if not _retry_aborts(self.participants, self._dirty):
            names = tuple(sorted(self._dirty))
            return f"abort still failing in {', '.join(names)} (staged rows of an aborted cycle)", names
        # Aborts left from recovery: nothing of them is in memory; best effort.
        _retry_aborts(self.participants, self._pending_aborts)
        return None

    @property
    def pending_aborts(self) -> dict[str, set[str]]:
        merged: dict[str, set[str]] = {}
        for src in (self._pending_aborts, self._dirty):
            for k, v in src.items():
                merged.setdefault(k, set()).update(v)
        return merged

    def close(self) -> None:
        for g in self.participants:
            try:
                close = getattr(g.sink, "close", None)
                if close is not None:
                    close()
            except Exception as exc:  # noqa: BLE001 - closing is best effort
                log.warning("eos sink=%s close failed: %s", g.name, exc)
        self.backend.close()
