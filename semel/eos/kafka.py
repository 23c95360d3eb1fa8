"""The real coordinator: a transactional confluent-kafka producer and a consumer.

Works against any Kafka-compatible broker with transactions; it speaks only
the Kafka protocol (through librdkafka).

* `init()` creates the producer and calls init_transactions(), which fences
  older instances with the same transactional id and completes or aborts their
  open transaction; only then is the ledger read.
* Inputs are assigned statically (topic, partition) and start at the group's
  committed offsets. The coordinator keeps the position of every input itself,
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
"""
from __future__ import annotations

import time
from typing import Iterable, Sequence

from confluent_kafka import Consumer, KafkaError as CKError, KafkaException, Producer, TopicPartition

from semel.eos.coordinator import CoordinatorError, EosCoordinator, Record
from semel.eos.ledger import Ledger
from semel.protocol.errors import KafkaError

DEFAULT_TXN_TIMEOUT_MS = 60_000


def _error(op: str, err: CKError) -> CoordinatorError:
    code: int | KafkaError = err.code()
    try:
        code = KafkaError(code)
    except ValueError:
        pass  # librdkafka-local (negative) codes are kept as plain ints
    return CoordinatorError(op, f"{err.name()}: {err.str()}", code=code, fatal=bool(err.fatal()))


def _ck(exc: KafkaException) -> CKError:
    return exc.args[0] if exc.args and isinstance(exc.args[0], CKError) else CKError(CKError._FAIL, str(exc))


class KafkaCoordinator(EosCoordinator):
    def __init__(self, bootstrap: str, transactional_id: str, inputs: Sequence[tuple[str, int]] = (), *,
                 group_id: str | None = None, marker_topic: str | None = None,
                 producer_config: dict | None = None, consumer_config: dict | None = None,
                 timeout: float = 30.0, transaction_timeout_ms: int | None = None,
                 marker_record: bool | None = None):
        if not inputs and not marker_topic:
            raise ValueError("KafkaCoordinator needs input partitions or a marker topic to carry the ledger")
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
            **(producer_config or {})}
        self._txn_timeout_given = transaction_timeout_ms is not None or "transaction.timeout.ms" in (
            producer_config or {})
        self._consumer_config = {
            "bootstrap.servers": bootstrap, "group.id": self.group_id, "enable.auto.commit": False,
            "isolation.level": "read_committed", "auto.offset.reset": "earliest",
            "enable.partition.eof": False, **(consumer_config or {})}
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._positions: dict[tuple[str, int], int] = {}
        self._begin_positions: dict[tuple[str, int], int] = {}
        self._delivery_error: CKError | None = None

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
        self._producer = Producer(self._producer_config)
        try:
            self._producer.init_transactions(self.timeout)
        except KafkaException as exc:
            raise _error("init", _ck(exc)) from None
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
        try:
            got = self._consumer.committed(parts, timeout=self.timeout)
        except KafkaException as exc:
            raise _error("read_ledger", _ck(exc)) from None
        for tp in got:
            if tp.error is not None:
                raise _error("read_ledger", tp.error)
        return got

    def _low_watermark(self, topic: str, partition: int) -> int:
        try:
            low, _high = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=self.timeout)
        except KafkaException as exc:
            raise _error("init", _ck(exc)) from None
        return low

    def _assign(self) -> None:
        self._consumer.assign([TopicPartition(t, p, off) for (t, p), off in self._positions.items()])

    # ------------------------------------------------------------ the cycle
    def begin_txn(self, cycle: int) -> None:
        self._delivery_error = None
        try:
            self._producer.begin_transaction()
        except KafkaException as exc:
            raise _error("begin_txn", _ck(exc)) from None
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
                    raise CoordinatorError("produce", "producer queue full for too long") from None
                self._producer.poll(0.05)
        self._producer.poll(0)

    def _delivered(self, err: CKError | None, _msg) -> None:
        if err is not None and self._delivery_error is None:
            self._delivery_error = err

    def flush(self, cycle: int) -> None:
        remaining = self._producer.flush(self.timeout)
        if remaining:
            raise CoordinatorError("flush", f"{remaining} records not acknowledged after {self.timeout}s")
        if self._delivery_error is not None:
            raise _error("flush", self._delivery_error)

    def commit_offsets(self, cycle: int, ledger: Ledger) -> None:
        meta = ledger.encode(self.transactional_id)
        offsets = [TopicPartition(t, p, off, meta) for (t, p), off in self._positions.items()]
        offsets += self._marker(ledger)
        try:
            self._producer.send_offsets_to_transaction(offsets, self._consumer.consumer_group_metadata(),
                                                       self.timeout)
        except KafkaException as exc:
            raise _error("commit_offsets", _ck(exc)) from None

    def commit_txn(self, cycle: int) -> None:
        # A retriable error leaves the outcome open; librdkafka resumes the same
        # commit on retry, so retry until it is known rather than guess.
        self._retrying("commit_txn", self._producer.commit_transaction)

    def abort_txn(self, cycle: int) -> None:
        self._retrying("abort_txn", self._producer.abort_transaction)
        self._positions = dict(self._begin_positions)
        self._assign()

    def _retrying(self, op: str, call) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                call(max(remaining, 0.1))
                return
            except KafkaException as exc:
                err = _ck(exc)
                if not err.retriable() or time.monotonic() >= deadline:
                    raise _error(op, err) from None

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
