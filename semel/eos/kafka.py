"""The real backend: a transactional confluent-kafka producer and a consumer.

Works against any Kafka-compatible broker with transactions; it speaks only
the Kafka protocol (through librdkafka).

* `init()` creates the producer and calls init_transactions(), which fences
  older instances with the same transactional id and completes or aborts their
  open transaction; only then is the ledger read.
* Inputs are assigned statically (topic, partition) and start at the group's
  committed offsets. The backend keeps the position of every input itself,
  so the offsets committed in a transaction are exactly what was processed in
  it, and an abort rewinds to the positions at beginTxn.
* The ledger (see `semel.eos.ledger`) rides in the offset metadata of every
  input partition, and, if `marker_topic` is given, as the committed offsets
  of that topic's partitions 0 (cycle) and 1 (hold floor), for brokers that
  drop offset metadata. The marker topic must exist with >= 2 partitions.
* With a marker topic, each transaction also carries one small record (key
  "semel-eos-cycle", value the cycle number) to marker partition 0, so no
  transaction is offsets-only: Tansu 0.6 silently drops the offsets of an
  offsets-only transaction after a producer's first one (measured here).
  Make the marker topic compacted to keep it small.

The consumer group defaults to the transactional id: one group per instance,
since each instance owns its inputs and its ledger.

Every librdkafka call that can block runs under a deadline (`timeout` plus
`DEADLINE_GRACE_S`), because librdkafka does not always keep its own timeout:
after a broker restart its send_offsets_to_transaction can wait for ever
(docs/librdkafka-restart-hang.md). A call past its deadline is abandoned with
the producer it was made on ("wedged"); aborting the cycle then replaces the
producer and calls init_transactions, which fences the old producer and has
the broker abort its open transaction: a clean abort, and the next cycle runs
on the new producer. A commit_transaction past its deadline cannot be
undone that way (it may have committed): abort_txn refuses, the cycle ends
CommitFatal and recovery at the next start decides from the ledger.

`RESTART_SAFE_CONFIG` is applied to both clients by default: librdkafka's
re-bootstrap (its default since 2.10) is what strands the group coordinator
after a single broker restarts.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable, Sequence

from confluent_kafka import Consumer, KafkaError as CKError, KafkaException, Producer, TopicPartition

from semel.eos.backend import BackendError, Record, TxnBackend
from semel.eos.deadline import DeadlineExceeded, call_with_deadline
from semel.eos.ledger import Ledger
from semel.protocol.errors import KafkaError

DEFAULT_TXN_TIMEOUT_MS = 60_000
# Seconds a librdkafka call may run past the timeout it was given before it counts as stuck.
DEADLINE_GRACE_S = 5.0
# librdkafka >= 2.10 re-bootstraps when every known broker is down (one broker
# restarting is enough) and forgets those brokers, but its coordinator cache keeps
# pointing at the forgotten one, so a group coordinator request waits for a broker
# state change that never comes (librdkafka issues 5456 and 5511). Without
# re-bootstrap the known broker reconnects and the request goes on.
RESTART_SAFE_CONFIG = {"metadata.recovery.strategy": "none"}


def _error(op: str, err: CKError) -> BackendError:
    code: int | KafkaError = err.code()
    if code >= KafkaError.UNKNOWN_SERVER_ERROR:
        code = KafkaError(code)
    # below -1 are librdkafka's local codes, kept as plain ints
    return BackendError(op, f"{err.name()}: {err.str()}", code=code, fatal=bool(err.fatal()))


def _ck(exc: KafkaException) -> CKError:
    return exc.args[0] if exc.args and isinstance(exc.args[0], CKError) else CKError(CKError._FAIL, str(exc))


class KafkaTxnBackend(TxnBackend):
    def __init__(self, bootstrap: str, transactional_id: str, inputs: Sequence[tuple[str, int]] = (), *,
                 group_id: str | None = None, marker_topic: str | None = None,
                 producer_config: dict | None = None, consumer_config: dict | None = None,
                 timeout: float = 30.0, transaction_timeout_ms: int | None = None,
                 marker_record: bool | None = None):
        if not inputs and not marker_topic:
            raise ValueError("KafkaTxnBackend needs input partitions or a marker topic to carry the ledger")
        for item in inputs:
            if (not isinstance(item, (tuple, list)) or len(item) != 2 or not isinstance(item[0], str)
                    or not isinstance(item[1], int) or item[1] < 0):
                raise ValueError(f"inputs are (topic, partition) pairs, got {item!r}")
        if not transactional_id:
            raise ValueError("transactional_id must be non-empty")
        self.bootstrap = bootstrap
        self.transactional_id = transactional_id
        self.group_id = group_id or transactional_id
        self.inputs = [(t, p) for t, p in inputs]
        self.marker_topic = marker_topic
        self.marker_record = bool(marker_topic) if marker_record is None else marker_record
        if self.marker_record and not marker_topic:
            raise ValueError("marker_record needs a marker_topic")
        self.timeout = timeout
        self._producer_config = {
            "bootstrap.servers": bootstrap, "transactional.id": transactional_id, "enable.idempotence": True,
            "transaction.timeout.ms": transaction_timeout_ms or DEFAULT_TXN_TIMEOUT_MS, "linger.ms": 5,
            **RESTART_SAFE_CONFIG, **(producer_config or {})}
        self._txn_timeout_given = transaction_timeout_ms is not None or "transaction.timeout.ms" in (
            producer_config or {})
        self._consumer_config = {
            "bootstrap.servers": bootstrap, "group.id": self.group_id, "enable.auto.commit": False,
            "isolation.level": "read_committed", "auto.offset.reset": "earliest",
            "enable.partition.eof": False, **RESTART_SAFE_CONFIG, **(consumer_config or {})}
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._positions: dict[tuple[str, int], int] = {}
        self._begin_positions: dict[tuple[str, int], int] = {}
        self._delivery_error: CKError | None = None
        # The step whose call on the current producer is stuck past its deadline (None: usable).
        self._wedged: str | None = None
        # Producers left with a stuck call, kept referenced until the call ends: destroying a
        # librdkafka handle while another thread is inside it would crash the process.
        self._abandoned: list[tuple[Producer, threading.Thread]] = []
        self._stuck_threads: list[threading.Thread] = []

    # ------------------------------------------------------------ start
    def expect_interval(self, seconds: float) -> None:
        # The broker transaction stays open for the whole interval (records are
        # produced into it as they are processed), so its timeout must outlast
        # the interval, or the broker aborts every cycle. Kafka's default cap
        # (transaction.max.timeout.ms) is 15 minutes.
        need = int(seconds * 1000 * 2 + 30_000)
        if self._txn_timeout_given:
            if self._producer_config["transaction.timeout.ms"] < seconds * 1000 + 10_000:
                raise ValueError(f"transaction.timeout.ms {self._producer_config['transaction.timeout.ms']} is too "
                                 f"short for a {seconds}s commit interval")
            return
        self._producer_config["transaction.timeout.ms"] = max(DEFAULT_TXN_TIMEOUT_MS, min(need, 900_000))

    def init(self) -> None:
        self.close()
        self._new_producer("init")
        self._consumer = Consumer(self._consumer_config)
        committed = self._committed()
        for (t, p), tp in zip(self.inputs, committed):
            self._positions[(t, p)] = tp.offset if tp.offset >= 0 else self._low_watermark(t, p)
        self._assign()

    def read_ledger(self) -> Ledger | None:
        got = self._committed(with_marker=True)
        n = len(self.inputs)
        tagged = [Ledger.decode(tp.metadata, self.transactional_id) for tp in got[:n]]
        tagged = [x for x in tagged if x is not None]
        if tagged:
            return max(tagged, key=lambda x: x.committed)
        if self.marker_topic and got[n].offset >= 0:
            return Ledger(got[n].offset, max(got[n + 1].offset, 0))
        if any(tp.offset >= 0 for tp in got):
            return None  # offsets without a ledger: cannot tell what committed
        return Ledger(0)

    def _marker(self, ledger: Ledger | None = None) -> list[TopicPartition]:
        if not self.marker_topic:
            return []
        if ledger is None:
            return [TopicPartition(self.marker_topic, 0), TopicPartition(self.marker_topic, 1)]
        return [TopicPartition(self.marker_topic, 0, ledger.committed),
                TopicPartition(self.marker_topic, 1, ledger.hold)]

    def _committed(self, with_marker: bool = False) -> list[TopicPartition]:
        parts = [TopicPartition(t, p) for t, p in self.inputs] + (self._marker() if with_marker else [])
        got = self._bounded("read_ledger", lambda: self._consumer.committed(parts, timeout=self.timeout))
        for tp in got:
            if tp.error is not None:
                raise _error("read_ledger", tp.error)
        return got

    def _low_watermark(self, topic: str, partition: int) -> int:
        tp = TopicPartition(topic, partition)
        low, _high = self._bounded("init", lambda: self._consumer.get_watermark_offsets(tp, timeout=self.timeout))
        return low

    def _assign(self) -> None:
        self._consumer.assign([TopicPartition(t, p, off) for (t, p), off in self._positions.items()])

    # ------------------------------------------------------------ the cycle
    def begin_txn(self, cycle: int) -> None:
        self._delivery_error = None
        self._on_producer("begin_txn", lambda p: p.begin_transaction())
        self._begin_positions = dict(self._positions)
        if self.marker_record:
            self.produce(self.marker_topic, str(cycle).encode(), key=b"semel-eos-cycle", partition=0)

    def poll(self, timeout: float) -> Record | None:
        msg = self._consumer.poll(timeout)
        if msg is None:
            return None
        if msg.error() is not None:
            if msg.error().code() == CKError._PARTITION_EOF:
                return None
            raise _error("poll", msg.error())
        key = (msg.topic(), msg.partition())
        if msg.offset() < self._positions.get(key, 0):
            return None  # fetched before a rewind: already behind our position
        self._positions[key] = msg.offset() + 1
        return Record(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                      tuple(msg.headers() or ()))

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None, partition: int | None = None,
                headers: Iterable | None = None) -> None:
        kwargs = {"value": value, "key": key, "on_delivery": self._delivered}
        if partition is not None:
            kwargs["partition"] = partition
        if headers:
            kwargs["headers"] = list(headers)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self._producer.produce(topic, **kwargs)
                break
            except BufferError:  # local queue full: let deliveries drain, then retry
                if time.monotonic() > deadline:
                    raise BackendError("produce", "producer queue full for too long") from None
                self._producer.poll(0.05)
        self._producer.poll(0)

    def _delivered(self, err: CKError | None, _msg) -> None:
        if err is not None and self._delivery_error is None:
            self._delivery_error = err

    def flush(self, cycle: int) -> None:
        remaining = self._on_producer("flush", lambda p: p.flush(self.timeout))
        if remaining:
            raise BackendError("flush", f"{remaining} records not acknowledged after {self.timeout}s")
        if self._delivery_error is not None:
            raise _error("flush", self._delivery_error)

    def commit_offsets(self, cycle: int, ledger: Ledger) -> None:
        meta = ledger.encode(self.transactional_id)
        offsets = [TopicPartition(t, p, off, meta) for (t, p), off in self._positions.items()]
        offsets += self._marker(ledger)
        group = self._consumer.consumer_group_metadata()
        self._on_producer("commit_offsets", lambda p: p.send_offsets_to_transaction(offsets, group, self.timeout))

    def commit_txn(self, cycle: int) -> None:
        # A retriable error leaves the outcome open; librdkafka resumes the same
        # commit on retry, so retry until it is known rather than guess.
        self._retrying("commit_txn", lambda p, t: p.commit_transaction(t))

    def abort_txn(self, cycle: int) -> None:
        if self._wedged is None:
            self._retrying("abort_txn", lambda p, t: p.abort_transaction(t))
        elif self._wedged == "commit_txn":
            # The stuck commit may have reached the broker: nothing here may claim an abort.
            raise BackendError("abort_txn", "commit_txn is still stuck; its outcome is unknown")
        else:
            # Fencing the wedged producer is the abort: the broker ends its open transaction.
            self._new_producer("abort_txn")
        self._positions = dict(self._begin_positions)
        self._assign()

    def _retrying(self, op: str, call: Callable[[Producer, float], Any]) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            remaining = max(deadline - time.monotonic(), 0.1)
            try:
                self._on_producer(op, lambda p: call(p, remaining))
                return
            except BackendError as exc:
                retriable = isinstance(exc.__cause__, KafkaException) and _ck(exc.__cause__).retriable()
                if not retriable or time.monotonic() >= deadline:
                    raise

    # ------------------------------------------------------------ deadlines
    def _bounded(self, op: str, call: Callable[[], Any]) -> Any:
        """call() under the deadline; librdkafka errors and stuck calls become BackendError."""
        self._stuck_threads = [t for t in self._stuck_threads if t.is_alive()]
        try:
            return call_with_deadline(call, self.timeout + DEADLINE_GRACE_S, self._stuck_threads,
                                      name=f"semel-eos-{op}")
        except KafkaException as exc:
            raise _error(op, _ck(exc)) from exc
        except DeadlineExceeded as exc:
            raise BackendError(op, f"no answer from the client library ({exc}); the call is abandoned",
                                   code=KafkaError.REQUEST_TIMED_OUT) from exc

    def _on_producer(self, op: str, call: Callable[[Producer], Any]) -> Any:
        """call(producer) under the deadline; a stuck call wedges the producer."""
        if self._wedged is not None:
            raise BackendError(op, f"the producer is unusable: {self._wedged} is still stuck in it")
        producer = self._producer
        try:
            return self._bounded(op, lambda: call(producer))
        except BackendError as exc:
            if isinstance(exc.__cause__, DeadlineExceeded):
                self._wedged = op
                self._abandoned.append((producer, self._stuck_threads[-1]))
            raise

    def _new_producer(self, op: str) -> None:
        """A fresh producer, initialised: fences every earlier one of this transactional id."""
        self._abandoned = [(p, t) for p, t in self._abandoned if t.is_alive()]
        self._producer, self._wedged = Producer(self._producer_config), None
        self._on_producer(op, lambda p: p.init_transactions(self.timeout))

    @property
    def positions(self) -> dict[tuple[str, int], int]:
        return dict(self._positions)

    def close(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()
            except (KafkaException, RuntimeError):
                pass
            self._consumer = None
        self._producer = None


def __getattr__(name: str):
    """KafkaCoordinator, the old name of KafkaTxnBackend, still resolves (with a warning)."""
    if name != "KafkaCoordinator":
        raise AttributeError(f"module 'semel.eos.kafka' has no attribute {name!r}")
    import warnings
    warnings.warn("semel.eos.kafka.KafkaCoordinator is now KafkaTxnBackend", DeprecationWarning, stacklevel=2)
    return KafkaTxnBackend
