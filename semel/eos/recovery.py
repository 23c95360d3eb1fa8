"""Recovery at start: resolve transactions that a crash left prepared.

For every participant (the state store and each sink) the runtime asks
recover() for its stranded txn ids and decides each one from the ledger the
broker committed (`semel.eos.ledger.decide`):

    COMMIT     its broker transaction committed -> participant.commit(id)
    ABORT      it did not                        -> participant.abort(id)
    UNDECIDED  cannot tell                       -> left as is; warning + metric

Ids of other app instances sharing the same external system are not ours to
decide and are skipped.

Start fails (RecoveryError) when going on could break exactly-once:
a participant cannot list its stranded ids, a decided commit fails (a newer
cycle would then make it look aborted), or there is no ledger to number the
next cycle from.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

from semel.eos.ledger import Decision, Ledger, decide
from semel.eos.outcomes import Ok, SinkOutcome
from semel.eos.sink import SinkGuard
from semel.eos.txnid import is_owned_prefix, owned_cycle

log = logging.getLogger("semel.eos")


class RecoveryError(Exception):
    def __init__(self, message: str, report: "RecoveryReport | None" = None):
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class RecoveryAction:
    participant: str
    txn_id: str
    decision: Decision
    outcome: SinkOutcome | None = None  # None when undecided (nothing was called)

    @property
    def done(self) -> bool:
        return isinstance(self.outcome, Ok)


@dataclass(frozen=True)
class RecoveryReport:
    ledger: Ledger | None
    next_cycle: int
    hold: int
    actions: tuple[RecoveryAction, ...] = ()
    foreign: tuple[tuple[str, str], ...] = ()
    # aborts that failed: (participant, txn_id), retried by the runtime
    failed_aborts: tuple[tuple[str, str], ...] = field(default=())

    def decided(self, decision: Decision) -> list[RecoveryAction]:
        return [a for a in self.actions if a.decision is decision]


def recover(app_id: str, instance_id: str, ledger: Ledger | None, participants: Sequence[SinkGuard],
            metrics=None, first_cycle: int | None = None) -> RecoveryReport:
    """Decide and resolve every stranded transaction of this app instance.

    `first_cycle` is an operator override for a broker that has no ledger
    (offsets exist but carry none): cycles are numbered from it, and stranded
    ids stay undecided.
    """
    if ledger is None and first_cycle is None:
        raise RecoveryError(
            "the consumer group has committed offsets but no semel ledger, so the last committed cycle is "
            "unknown: the broker may drop offset metadata (configure a marker topic), or another application "
            "uses this group. Pass first_cycle to override after checking the sinks by hand.")
    stranded, foreign = _list_stranded(app_id, instance_id, participants)
    actions: list[RecoveryAction] = []
    failed_commits: list[RecoveryAction] = []
    failed_aborts: list[tuple[str, str]] = []
    for guard, txn_id, cycle in stranded:
        decision = decide(cycle, ledger)
        action = _resolve(guard, txn_id, decision)
        actions.append(action)
        if metrics is not None:
            metrics.recovery.labels(guard.name, str(decision)).inc()
        if decision is Decision.COMMIT and not action.done:
            failed_commits.append(action)
        elif decision is Decision.ABORT and not action.done:
            failed_aborts.append((guard.name, txn_id))
    if metrics is not None:
        for guard in participants:
            n = sum(1 for a in actions if a.participant == guard.name and a.decision is Decision.UNDECIDED)
            metrics.undecided.labels(guard.name).set(n)
    report = _report(ledger, stranded, actions, foreign, failed_aborts, first_cycle)
    if failed_commits:
        names = ", ".join(f"{a.participant}:{a.txn_id}" for a in failed_commits)
        raise RecoveryError(f"could not finish committed transactions ({names}); not starting, "
                            "since a newer cycle would make them look aborted", report)
    return report


def _list_stranded(app_id: str, instance_id: str, participants: Sequence[SinkGuard]):
    stranded: list[tuple[SinkGuard, str, int | None]] = []
    foreign: list[tuple[str, str]] = []
    for guard in participants:
        listed = guard.recover()
        if listed.failure is not None:
            raise RecoveryError(f"{guard.name}: cannot list stranded transactions: "
                                f"{getattr(listed.failure, 'reason', listed.failure)}")
        for txn_id in listed.ids:
            if not is_owned_prefix(txn_id, app_id, instance_id):
                foreign.append((guard.name, txn_id))
                continue
            stranded.append((guard, txn_id, owned_cycle(txn_id, app_id, instance_id)))
    return stranded, foreign


def _resolve(guard: SinkGuard, txn_id: str, decision: Decision) -> RecoveryAction:
    if decision is Decision.COMMIT:
        outcome = guard.commit(txn_id, step="recover")
    elif decision is Decision.ABORT:
        outcome = guard.abort(txn_id, step="recover")
    else:
        log.warning("eos sink=%s step=recover txn=%s undecided: the broker ledger cannot tell whether its "
                    "transaction committed; left as is for an operator", guard.name, txn_id)
        return RecoveryAction(guard.name, txn_id, decision)
    log.info("eos sink=%s step=recover txn=%s decision=%s outcome=%r", guard.name, txn_id, decision, outcome)
    return RecoveryAction(guard.name, txn_id, decision, outcome)


def _report(ledger, stranded, actions, foreign, failed_aborts, first_cycle) -> RecoveryReport:
    undecided = [c for (_, _, c), a in zip(stranded, actions) if a.decision is Decision.UNDECIDED and c]
    hold = min(undecided) if undecided else 0
    known = [c for _, _, c in stranded if c is not None]
    floor = max([ledger.committed if ledger else 0, hold, *known, (first_cycle or 1) - 1])
    return RecoveryReport(ledger, floor + 1, hold, tuple(actions), tuple(foreign), tuple(failed_aborts))
