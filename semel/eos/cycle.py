"""One commit cycle: the seven steps and what each failure leads to.

    beginTxn -> flush -> commitOffsets -> preCommit2PC -> commitTxn -> commit2PC -> storeCommit

`ON_FAILURE` is the outcome table. Three resolutions:

* STOP: CommitFatal, nothing is undone here (beginTxn: nothing began;
  storeCommit: everything else already committed).
* ROLL_BACK: abort the broker transaction, drop the store's buffer, abort every
  sink (aborting a sink that never prepared just drops its staged rows), then
  CommitAborted, to be retried next cycle. A sink answering Fatal makes it
  CommitFatal after the same clean-up.
* ROLL_FORWARD (commit2PC): the broker transaction is durable, so the decision
  is commit. Every sink is still asked to commit and the store still drains;
  then CommitFatal, naming the sinks that are left prepared for recovery.

Failures inside the abort path:

* abortTxn fails after a commitTxn failure: the broker may have committed
  (e.g. the commit succeeded but its answer was lost). Nothing is aborted;
  every participant is left prepared and recovery decides from the ledger.
  CommitFatal.
* abortTxn fails earlier: commit was never requested, so the broker cannot
  commit; participants are still aborted. CommitFatal, since the producer is
  in an unknown state and a restart re-initialises it.
* the store's abort fails: its buffer may leak into the next cycle, so
  CommitFatal.
* a sink's abort fails: the sink holds an invisible prepared batch of an
  aborted cycle (and maybe staged rows in memory). CommitAborted, naming the
  sink in `stranded`. The runtime retries the abort when the next cycle
  begins and, if it fails again, ends that cycle CommitFatal at beginTxn
  rather than let old staged rows leak into it; recovery aborts the batch at
  the next start.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Sequence

from semel.eos.backend import TxnBackend
from semel.eos.ledger import Ledger
from semel.eos.outcomes import (CommitAborted, CommitFatal, CommitSucceeded, CycleOutcome, Fatal, Ok,
                                SinkOutcome, Step)
from semel.eos.sink import SinkGuard

log = logging.getLogger("semel.eos")


class Resolution(Enum):
    STOP = "stop"
    ROLL_BACK = "roll back"
    ROLL_FORWARD = "roll forward"


ON_FAILURE: dict[Step, Resolution] = {
    Step.BEGIN_TXN: Resolution.STOP,
    Step.FLUSH: Resolution.ROLL_BACK,
    Step.COMMIT_OFFSETS: Resolution.ROLL_BACK,
    Step.PRE_COMMIT_2PC: Resolution.ROLL_BACK,
    Step.COMMIT_TXN: Resolution.ROLL_BACK,
    Step.COMMIT_2PC: Resolution.ROLL_FORWARD,
    Step.STORE_COMMIT: Resolution.STOP,
}


@dataclass
class Failure:
    """Why a step failed. `fatal`: a participant said Fatal (invariant broken)."""

    reason: str
    fatal: bool = False
    stranded: tuple[str, ...] = ()


@dataclass
class CycleParts:
    """Everything one cycle works with."""

    backend: TxnBackend
    sinks: Sequence[SinkGuard] = ()
    store: SinkGuard | None = None
    # runs the application's processing for this cycle (inside the flush step)
    work: Callable[[], Any] | None = None
    # extra rows for a sink at prepare: rows_for(txn_id, sink_name)
    rows_for: Callable[[str, str], Sequence[Any]] | None = None
    # test/chaos instrument: called with "before:<step>", "after:<step>",
    # "preCommit2PC:<sink>", "commit2PC:<sink>"; raising fails the step
    on_event: Callable[[str], None] | None = None
    # hold floor carried in the ledger (see semel.eos.ledger)
    hold: int = 0
    metrics: Any = None
    participants: list[SinkGuard] = field(init=False)

    def __post_init__(self) -> None:
        self.participants = ([self.store] if self.store is not None else []) + list(self.sinks)


class _Cycle:
    def __init__(self, cycle: int, txn_id: str, parts: CycleParts):
        self.cycle, self.txn_id, self.p = cycle, txn_id, parts
        self.steps: dict[Step, Callable[[], Failure | None]] = {
            Step.BEGIN_TXN: self._begin,
            Step.FLUSH: self._flush,
            Step.COMMIT_OFFSETS: self._commit_offsets,
            Step.PRE_COMMIT_2PC: self._pre_commit,
            Step.COMMIT_TXN: self._commit_txn,
            Step.COMMIT_2PC: self._commit_2pc,
            Step.STORE_COMMIT: self._store_commit,
        }

    # ------------------------------------------------------------ driver
    def run(self) -> CycleOutcome:
        for step in ON_FAILURE:
            failure = self._run_step(step)
            if failure is None:
                continue
            log.warning("eos cycle=%d txn=%s step=%s failed: %s", self.cycle, self.txn_id, step, failure.reason)
            resolution = ON_FAILURE[step]
            if resolution is Resolution.STOP:
                return CommitFatal(self.cycle, self.txn_id, step, failure.reason, failure.stranded)
            if resolution is Resolution.ROLL_BACK:
                return self._roll_back(step, failure)
            return self._roll_forward(step, failure)
        return CommitSucceeded(self.cycle, self.txn_id)

    def _run_step(self, step: Step) -> Failure | None:
        try:
            self._event(f"before:{step}")
            failure = self.steps[step]()
            if failure is None:
                self._event(f"after:{step}")
            return failure
        except Exception as exc:  # noqa: BLE001 - pluggable code fails as a value
            return Failure(_describe(exc))

    def _event(self, name: str) -> None:
        if self.p.on_event is not None:
            self.p.on_event(name)

    # ------------------------------------------------------------ steps
    def _begin(self) -> Failure | None:
        self.p.backend.begin_txn(self.cycle)
        return None

    def _flush(self) -> Failure | None:
        if self.p.work is not None:
            self.p.work()
        self.p.backend.flush(self.cycle)
        return None

    def _commit_offsets(self) -> Failure | None:
        self.p.backend.commit_offsets(self.cycle, Ledger(self.cycle, self.p.hold))
        return None

    def _pre_commit(self) -> Failure | None:
        # The store first: it is local and cheap, and sinks are the slow part.
        if self.p.store is not None:
            failure = _check(self.p.store, self.p.store.prepare(self.txn_id, (), step=str(Step.PRE_COMMIT_2PC)))
            if failure is not None:
                return failure
        for sink in self.p.sinks:
            rows = self.p.rows_for(self.txn_id, sink.name) if self.p.rows_for is not None else ()
            failure = _check(sink, sink.prepare(self.txn_id, rows))
            if failure is not None:
                return failure
            self._event(f"preCommit2PC:{sink.name}")
        return None

    def _commit_txn(self) -> Failure | None:
        self.p.backend.commit_txn(self.cycle)
        return None

    def _commit_2pc(self) -> Failure | None:
        # Try every sink even after one fails: the decision is commit, so each
        # sink that can finish should finish now rather than at the next start.
        failures = []
        for sink in self.p.sinks:
            failure = _check(sink, sink.commit(self.txn_id))
            if failure is not None:
                failures.append(failure)
            self._event(f"commit2PC:{sink.name}")
        return _merge(failures)

    def _store_commit(self) -> Failure | None:
        if self.p.store is None:
            return None
        return _check(self.p.store, self.p.store.commit(self.txn_id, step=str(Step.STORE_COMMIT)))

    # ------------------------------------------------------------ resolutions
    def _roll_back(self, step: Step, failure: Failure) -> CycleOutcome:
        notes = [failure.reason]
        fatal = failure.fatal
        try:
            self.p.backend.abort_txn(self.cycle)
        except Exception as exc:  # noqa: BLE001
            notes.append(f"abortTxn failed: {_describe(exc)}")
            log.error("eos cycle=%d txn=%s step=abortTxn failed: %s", self.cycle, self.txn_id, _describe(exc))
            if step is Step.COMMIT_TXN:
                # The commit may have reached the broker: abort nothing, let
                # recovery decide from the ledger at the next start.
                left = tuple(g.name for g in self.p.participants)
                return CommitFatal(self.cycle, self.txn_id, step, "; ".join(notes), left)
            fatal = True
        stranded: list[str] = []
        if self.p.store is not None:
            outcome = self.p.store.abort(self.txn_id, step=f"{step}/abort")
            if not isinstance(outcome, Ok):
                notes.append(f"store abort failed: {_reason(outcome)}")
                stranded.append(self.p.store.name)
                fatal = True  # an undropped buffer would leak into the next cycle
        for sink in self.p.sinks:
            outcome = sink.abort(self.txn_id, step=f"{step}/abort")
            if not isinstance(outcome, Ok):
                notes.append(f"sink {sink.name} abort failed: {_reason(outcome)}")
                stranded.append(sink.name)
                fatal = fatal or isinstance(outcome, Fatal)
        cls = CommitFatal if fatal else CommitAborted
        return cls(self.cycle, self.txn_id, step, "; ".join(notes), tuple(stranded))

    def _roll_forward(self, step: Step, failure: Failure) -> CycleOutcome:
        notes = [failure.reason]
        stranded = list(failure.stranded)
        store_failure = self._run_step(Step.STORE_COMMIT)
        if store_failure is not None:
            notes.append(f"storeCommit failed: {store_failure.reason}")
            stranded.extend(store_failure.stranded)
        return CommitFatal(self.cycle, self.txn_id, step, "; ".join(notes), tuple(stranded))


def _check(guard: SinkGuard, outcome: SinkOutcome) -> Failure | None:
    if isinstance(outcome, Ok):
        return None
    return Failure(f"{guard.name}: {_reason(outcome)}", fatal=isinstance(outcome, Fatal), stranded=(guard.name,))


def _merge(failures: list[Failure]) -> Failure | None:
    if not failures:
        return None
    return Failure("; ".join(f.reason for f in failures), fatal=any(f.fatal for f in failures),
                   stranded=tuple(n for f in failures for n in f.stranded))


def _reason(outcome: SinkOutcome) -> str:
    kind = "fatal" if isinstance(outcome, Fatal) else "retryable"
    return f"{kind}: {getattr(outcome, 'reason', outcome)}"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def run_commit_cycle(cycle: int, txn_id: str, parts: CycleParts) -> CycleOutcome:
    """Run one cycle and return its outcome; never raises for participant failures."""
    started = time.perf_counter()
    outcome = _Cycle(cycle, txn_id, parts).run()
    if parts.metrics is not None:
        step = str(getattr(outcome, "step", "none"))
        parts.metrics.cycle_done(outcome.kind, step, time.perf_counter() - started)
    if isinstance(outcome, CommitFatal):
        log.error("eos cycle=%d txn=%s outcome=CommitFatal step=%s: %s stranded=%s", cycle, txn_id,
                  outcome.step, outcome.reason, ",".join(outcome.stranded) or "-")
    elif isinstance(outcome, CommitAborted):
        log.warning("eos cycle=%d txn=%s outcome=CommitAborted step=%s: %s", cycle, txn_id, outcome.step,
                    outcome.reason)
    return outcome
