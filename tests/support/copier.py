"""A consume-transform-produce copy with confluent-kafka written as a real application
against a cluster whose brokers are killed: it keeps its failures instead of raising
them, so a test can show them when the copy does not finish."""
from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from semel.eos.deadline import DeadlineExceeded, call_with_deadline
from semel.eos.kafka import DEADLINE_GRACE_S, RESTART_SAFE_CONFIG

COMMITTED_PATIENCE_S = 60
TXN_TIMEOUT_S = 60
# How long a send_offsets_to_transaction or commit_transaction may run before the copier
# abandons it with its producer. librdkafka is given the whole transaction timeout, so
# it never gives up first (a timed-out commit would leave the transaction half-ended);
# the copier's patience is shorter, so that a call stuck after a coordinator moved
# (librdkafka issue 5511) is replaced, and the copier commits again, within that timeout.
CALL_PATIENCE_S = 25


class Copier:
    """A consume-transform-produce application as a real one is written against a cluster:
    abortable errors abort and rewind to the committed offsets, fatal ones re-create the
    producer (same transactional id: the new instance fences the old). A call still
    running past its timeout is abandoned with its producer, as the eos runtime does:
    librdkafka can wait for ever in send_offsets_to_transaction once it has dropped the
    group coordinator's broker (librdkafka issue 5511, docs/cluster.md). The new producer's
    init_transactions ends the stuck one's transaction, so rewinding to the committed
    offsets is right whichever way it ended."""

    def __init__(self, cluster, src: str, dst: str, txn_id: str):
        self.cluster, self.src, self.dst, self.txn_id = cluster, src, dst, txn_id
        self.consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"g-{txn_id}",
                                  "isolation.level": "read_committed", "enable.auto.commit": False,
                                  "auto.offset.reset": "earliest", **RESTART_SAFE_CONFIG})
        self.commits = 0
        self.failures: list[str] = []
        self.abandoned: list = []   # stuck producers and their threads, kept from collection
        self.producer = self._producer()

    def _producer(self) -> Producer:
        """A new instance (it fences the old one), initialised again while the coordinator moves."""
        for _ in range(5):
            p = Producer({"bootstrap.servers": self.cluster.bootstrap, "transactional.id": self.txn_id,
                          "transaction.timeout.ms": TXN_TIMEOUT_S * 1000, **RESTART_SAFE_CONFIG})
            try:
                p.init_transactions(60)
                return p
            except KafkaException as exc:
                self.failures.append(f"init_transactions: {exc}")
        raise AssertionError(f"init_transactions never succeeded: {self.failures[-3:]}")

    def run(self, ends: dict[int, int], on_commit) -> None:
        self.consumer.subscribe([self.src])
        try:
            while not self._done(ends):
                msgs = [m for m in self.consumer.consume(40, 1.0) if not m.error()]
                if msgs:
                    self._transaction(msgs, on_commit)
        finally:
            self.consumer.close()

    def _done(self, ends: dict[int, int]) -> bool:
        tps = [TopicPartition(self.src, p) for p in ends]
        return all(tp.offset == ends[tp.partition] for tp in self._committed(tps))

    def _committed(self, tps) -> list:
        """The group's committed offsets, asked again while its coordinator moves (a
        NOT_COORDINATOR answer comes back at once: librdkafka looks the coordinator up
        again meanwhile, so the next try waits a moment)."""
        deadline = time.monotonic() + COMMITTED_PATIENCE_S
        while True:
            try:
                return self.consumer.committed(tps, 30)
            except KafkaException as exc:
                self.failures.append(f"committed: {exc}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"committed offsets unreadable: {self.failures[-3:]}") from None
                time.sleep(0.1)

    def _transaction(self, msgs, on_commit) -> None:
        try:
            self.producer.begin_transaction()
            for m in msgs:
                self.producer.produce(self.dst, value=m.value(), partition=m.partition())
            offsets, meta, p = self.consumer.position(self.consumer.assignment()), \
                self.consumer.consumer_group_metadata(), self.producer
            self._call(lambda: p.send_offsets_to_transaction(offsets, meta, TXN_TIMEOUT_S))
            self._call(lambda: p.commit_transaction(TXN_TIMEOUT_S))
            self.commits += 1
            on_commit(self.commits)
        except KafkaException as exc:
            self.failures.append(str(exc))
            self._recover(exc.args[0])
        except DeadlineExceeded as exc:
            self.failures.append(f"librdkafka call stuck: {exc}")
            self.abandoned.append(self.producer)
            self.producer = self._producer()
            self._rewind()

    def _call(self, fn):
        return call_with_deadline(fn, CALL_PATIENCE_S + DEADLINE_GRACE_S, self.abandoned, name="copier-call")

    def _recover(self, err) -> None:
        if err.txn_requires_abort():
            try:
                self.producer.abort_transaction(60)
            except KafkaException:
                self.producer = self._producer()
        elif not err.retriable():
            self.producer = self._producer()
        self._rewind()

    def _rewind(self) -> None:
        """Whatever the last transaction did, go on from what the group committed."""
        for tp in self._committed(self.consumer.assignment()):
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))
