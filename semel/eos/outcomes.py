"""Outcome values of the exactly-once runtime.

Two families:

* `SinkOutcome` is what a two-phase-commit participant answers for one
  operation: `OK`, `Retryable(reason)` (transient; the cycle aborts and the
  work is retried next cycle) or `Fatal(reason)` (an invariant is broken; the
  runtime stops and an operator looks).
* `CycleOutcome` is what one commit cycle ends in: `CommitSucceeded`,
  `CommitAborted` (rolled back everywhere, retry next cycle) or `CommitFatal`
  (stop; whatever is stranded is resolved by recovery at the next start).

They are plain frozen values so tests can compare them and logs can print them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Union


# ---------------------------------------------------------------- sink outcomes

@dataclass(frozen=True)
class Ok:
    """The operation happened, or had already happened (idempotent repeat)."""

    def __repr__(self) -> str:
        return "OK"


OK = Ok()


@dataclass(frozen=True)
class Retryable:
    reason: str


@dataclass(frozen=True)
class Fatal:
    reason: str


SinkOutcome = Union[Ok, Retryable, Fatal]
SINK_OUTCOME_TYPES = (Ok, Retryable, Fatal)


# ---------------------------------------------------------------- cycle steps

class Step(str, Enum):
    """The seven steps of a commit cycle, in the order they run."""

    BEGIN_TXN = "beginTxn"
    FLUSH = "flush"
    COMMIT_OFFSETS = "commitOffsets"
    PRE_COMMIT_2PC = "preCommit2PC"
    COMMIT_TXN = "commitTxn"
    COMMIT_2PC = "commit2PC"
    STORE_COMMIT = "storeCommit"

    def __str__(self) -> str:  # log lines and metric labels use the spec's names
        return self.value


# ---------------------------------------------------------------- cycle outcomes

@dataclass(frozen=True)
class CommitSucceeded:
    cycle: int
    txn_id: str
    kind: str = field(default="succeeded", init=False, repr=False)


@dataclass(frozen=True)
class CommitAborted:
    """Rolled back: broker transaction aborted, store buffers dropped, sinks aborted.

    `stranded` names participants whose abort failed; their prepared state is
    invisible to readers and is aborted again later (next cycle or next start).
    """

    cycle: int
    txn_id: str
    step: Step
    reason: str
    stranded: tuple[str, ...] = ()
    kind: str = field(default="aborted", init=False, repr=False)


@dataclass(frozen=True)
class CommitFatal:
    """The runtime must stop. `stranded` names participants left prepared."""

    cycle: int
    txn_id: str
    step: Step
    reason: str
    stranded: tuple[str, ...] = ()
    kind: str = field(default="fatal", init=False, repr=False)


CycleOutcome = Union[CommitSucceeded, CommitAborted, CommitFatal]
