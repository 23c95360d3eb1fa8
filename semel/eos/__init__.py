"""Exactly-once runtime: the commit cycle, two-phase-commit sinks, recovery.

Talks to brokers only over the Kafka protocol (confluent-kafka in
`semel.eos.kafka`), never to semel's broker internals, so it works against any
Kafka-compatible broker.

Public API:

    EosRuntime, CycleContext, RuntimeFailed           semel.eos.runtime
    run_commit_cycle, CycleParts, ON_FAILURE          semel.eos.cycle
    TwoPhaseSink, SinkGuard                           semel.eos.sink
    OK, Retryable, Fatal, Step,
    CommitSucceeded, CommitAborted, CommitFatal       semel.eos.outcomes
    TxnBackend, RecordingTxnBackend,
    RecordingBroker, BackendError, Record             semel.eos.backend
    KafkaTxnBackend                                   semel.eos.kafka (imports confluent_kafka: the clients extra)
    Ledger, Decision, decide                          semel.eos.ledger
    recover, RecoveryReport, RecoveryError            semel.eos.recovery
    TransactionalStore, MemoryBacking,
    SqliteBacking, IdempotencyTokens                  semel.eos.store
    EosMetrics                                        semel.eos.metrics
    SinkTxnId                                         semel.eos.txnid
    sinks: semel.eos.sinks.<system>
"""
from semel.eos.backend import BackendError, Record, RecordingBroker, RecordingTxnBackend, TxnBackend
from semel.eos.cycle import ON_FAILURE, CycleParts, run_commit_cycle
from semel.eos.ledger import Decision, Ledger, decide
from semel.eos.metrics import EosMetrics
from semel.eos.outcomes import (OK, CommitAborted, CommitFatal, CommitSucceeded, CycleOutcome, Fatal, Ok,
                                Retryable, SinkOutcome, Step)
from semel.eos.recovery import RecoveryError, RecoveryReport, recover
from semel.eos.runtime import CycleContext, EosRuntime, RuntimeFailed
from semel.eos.sink import SinkGuard, TwoPhaseSink
from semel.eos.store import IdempotencyTokens, MemoryBacking, SqliteBacking, TransactionalStore
from semel.eos.txnid import SinkTxnId

__all__ = [
    "BackendError", "TxnBackend", "Record", "RecordingBroker", "RecordingTxnBackend",
    "ON_FAILURE", "CycleParts", "run_commit_cycle", "Decision", "Ledger", "decide", "EosMetrics",
    "OK", "Ok", "Retryable", "Fatal", "SinkOutcome", "Step", "CommitAborted", "CommitFatal", "CommitSucceeded",
    "CycleOutcome", "RecoveryError", "RecoveryReport", "recover", "CycleContext", "EosRuntime", "RuntimeFailed",
    "SinkGuard", "TwoPhaseSink", "IdempotencyTokens", "MemoryBacking", "SqliteBacking", "TransactionalStore",
    "SinkTxnId",
]

# The broker side of the commit cycle was called a "coordinator", the word Kafka uses for
# its group and transaction coordinators; old names still resolve, with a warning.
_RENAMED = {"EosCoordinator": "TxnBackend", "RecordingCoordinator": "RecordingTxnBackend",
            "CoordinatorError": "BackendError"}


def __getattr__(name: str):
    new = _RENAMED.get(name)
    if new is None:
        raise AttributeError(f"module 'semel.eos' has no attribute {name!r}")
    import warnings
    warnings.warn(f"semel.eos.{name} is now semel.eos.{new}", DeprecationWarning, stacklevel=2)
    return globals()[new]
