"""The backend behind the commit cycle: the broker side of exactly-once.

`TxnBackend` is the pluggable surface. `semel.eos.kafka.KafkaTxnBackend`
implements it on a transactional confluent-kafka producer and consumer;
`RecordingTxnBackend` implements it on an in-memory model of a broker
(`RecordingBroker`) that records every call and can fail any of them on
purpose, for tests and the chaos suite.

Failures are raised as `BackendError`; the cycle turns them into outcome
values.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from semel.eos.ledger import Ledger


class BackendError(Exception):
    """A broker-side step failed.

    `code` is a Kafka error code when the broker gave one (a
    `semel.protocol.errors.KafkaError` value, or librdkafka's local negative
    code), `fatal` is True when the producer cannot be used again.
    """

    def __init__(self, op: str, message: str, code: int | None = None, fatal: bool = False):
        super().__init__(f"{op}: {message}")
        self.op = op
        self.code = code
        self.fatal = fatal


@dataclass(frozen=True)
class Record:
    """A consumed input record, as the runtime hands it to application code."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple = ()


class TxnBackend(abc.ABC):
    """Broker operations of the commit cycle, plus start-time recovery reads."""

    transactional_id: str

    @abc.abstractmethod
    def init(self) -> None:
        """Fence older instances; complete or abort their open transaction."""

    @abc.abstractmethod
    def read_ledger(self) -> Ledger | None:
        """Ledger of the last committed cycle; Ledger(0) if nothing was ever
        committed; None if offsets exist but carry no ledger we can read."""

    @abc.abstractmethod
    def begin_txn(self, cycle: int) -> None: ...

    @abc.abstractmethod
    def flush(self, cycle: int) -> None:
        """Wait until every record produced in the cycle is acknowledged."""

    @abc.abstractmethod
    def commit_offsets(self, cycle: int, ledger: Ledger) -> None:
        """Put the consumed positions and the ledger into the open transaction."""

    @abc.abstractmethod
    def commit_txn(self, cycle: int) -> None: ...

    @abc.abstractmethod
    def abort_txn(self, cycle: int) -> None:
        """Abort the open transaction and rewind consumption to its start."""

    def expect_interval(self, seconds: float) -> None:
        """Told the commit interval before init(), e.g. to size transaction timeouts."""

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None,
                partition: int | None = None, headers: Iterable | None = None) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not produce records")

    def poll(self, timeout: float) -> Record | None:
        raise NotImplementedError(f"{type(self).__name__} does not consume records")

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- recording model

@dataclass
class _Open:
    cycle: int
    epoch: int
    records: list = field(default_factory=list)
    ledger: Ledger | None = None
    position: int | None = None


@dataclass
class Committed:
    cycle: int
    records: list
    ledger: Ledger | None
    position: int | None


class RecordingBroker:
    """In-memory broker state that outlives backend instances (a "restart").

    Holds the input log, the committed output records, the committed position
    and ledger, and open transactions keyed by transactional id.
    """

    def __init__(self, inputs: Iterable[Any] = (), keeps_ledger: bool = True):
        self.inputs: list[Any] = list(inputs)
        self.committed: list[Committed] = []
        self.aborted: list[int] = []
        self.open: dict[str, _Open] = {}
        self.epochs: dict[str, int] = {}
        self.ledger: Ledger | None = None
        self.position: int | None = None
        # False models a broker that loses offset metadata and has no marker.
        self.keeps_ledger = keeps_ledger

    def committed_cycles(self) -> list[int]:
        return [c.cycle for c in self.committed]

    def output(self) -> list[Any]:
        return [r for c in self.committed for r in c.records]


@dataclass
class Fault:
    """Make one backend operation fail. `after=True`: its effect happens first."""

    error: str = "injected failure"
    after: bool = False
    fatal: bool = False


FaultPlan = Callable[[str, int], "Fault | None"]


class RecordingTxnBackend(TxnBackend):
    """A `TxnBackend` on a `RecordingBroker`; records calls, injects faults.

    Faults come from `faults` (op name -> Fault, used once) or from `plan`
    (called as plan(op, cycle) before every operation).
    """

    OPS = ("init", "read_ledger", "begin_txn", "flush", "commit_offsets", "commit_txn", "abort_txn")

    def __init__(self, broker: RecordingBroker | None = None, transactional_id: str = "app-0",
                 plan: FaultPlan | None = None):
        self.broker = broker if broker is not None else RecordingBroker()
        self.transactional_id = transactional_id
        self.calls: list[tuple[str, int]] = []
        self.faults: dict[str, Fault] = {}
        self.plan = plan
        self._epoch: int | None = None
        self._position = 0
        self._begin_position = 0

    def fail(self, op: str, error: str = "injected failure", after: bool = False, fatal: bool = False) -> None:
        if op not in self.OPS:
            raise ValueError(f"unknown backend op {op!r}; known: {', '.join(self.OPS)}")
        self.faults[op] = Fault(error, after, fatal)

    # -- fault plumbing
    def _fault(self, op: str, cycle: int) -> Fault | None:
        self.calls.append((op, cycle))
        fault = self.faults.pop(op, None)
        if fault is None and self.plan is not None:
            fault = self.plan(op, cycle)
        return fault

    def _run(self, op: str, cycle: int, effect: Callable[[], Any]) -> Any:
        fault = self._fault(op, cycle)
        if fault is not None and not fault.after:
            raise BackendError(op, fault.error, fatal=fault.fatal)
        value = effect()
        if fault is not None:
            raise BackendError(op, fault.error, fatal=fault.fatal)
        return value

    def _txn(self, op: str) -> _Open:
        txn = self.broker.open.get(self.transactional_id)
        if txn is None or txn.epoch != self._epoch:
            raise BackendError(op, "no open transaction for this producer (fenced or never begun)",
                                   fatal=txn is not None)
        return txn

    # -- TxnBackend
    def init(self) -> None:
        def effect() -> None:
            b = self.broker
            b.epochs[self.transactional_id] = b.epochs.get(self.transactional_id, -1) + 1
            self._epoch = b.epochs[self.transactional_id]
            stale = b.open.pop(self.transactional_id, None)
            if stale is not None:  # a previous instance's unfinished transaction
                b.aborted.append(stale.cycle)
            self._position = b.position or 0
        self._run("init", 0, effect)

    def read_ledger(self) -> Ledger | None:
        def effect() -> Ledger | None:
            b = self.broker
            if b.position is None and b.ledger is None:
                return Ledger(0)
            return b.ledger if b.keeps_ledger else None
        return self._run("read_ledger", 0, effect)

    def begin_txn(self, cycle: int) -> None:
        def effect() -> None:
            if self.broker.epochs.get(self.transactional_id) != self._epoch:
                raise BackendError("begin_txn", "producer fenced by a newer instance", fatal=True)
            if self.transactional_id in self.broker.open:
                raise BackendError("begin_txn", "a transaction is already open")
            self.broker.open[self.transactional_id] = _Open(cycle, self._epoch)
            self._begin_position = self._position
        self._run("begin_txn", cycle, effect)

    def produce(self, topic: str, value: Any, key: Any = None, partition: int | None = None,
                headers: Iterable | None = None) -> None:
        self._txn("produce").records.append((topic, key, value))

    def poll(self, timeout: float = 0.0) -> Record | None:
        if self._position >= len(self.broker.inputs):
            return None
        offset = self._position
        self._position += 1
        return Record("input", 0, offset, None, self.broker.inputs[offset])

    def flush(self, cycle: int) -> None:
        self._run("flush", cycle, lambda: self._txn("flush"))

    def commit_offsets(self, cycle: int, ledger: Ledger) -> None:
        def effect() -> None:
            txn = self._txn("commit_offsets")
            txn.ledger, txn.position = ledger, self._position
        self._run("commit_offsets", cycle, effect)

    def commit_txn(self, cycle: int) -> None:
        def effect() -> None:
            txn = self._txn("commit_txn")
            b = self.broker
            del b.open[self.transactional_id]
            b.committed.append(Committed(txn.cycle, txn.records, txn.ledger, txn.position))
            if txn.position is not None:
                b.position = txn.position
            if txn.ledger is not None:
                b.ledger = txn.ledger
        self._run("commit_txn", cycle, effect)

    def abort_txn(self, cycle: int) -> None:
        def effect() -> None:
            # Like Kafka: aborting a transaction that is no longer open (e.g. its
            # commit went through though the call reported failure) is an error.
            txn = self._txn("abort_txn")
            del self.broker.open[self.transactional_id]
            self.broker.aborted.append(txn.cycle)
            self._position = self._begin_position
        self._run("abort_txn", cycle, effect)
