"""Byte-exact transactional and idempotent producers for protocol tests."""
from __future__ import annotations

from semel.client import Client
from semel.protocol import records
from semel.protocol.errors import KafkaError
from semel.protocol.messages import request_class

E = KafkaError


def call(c: Client, api_key: int, version: int, **fields):
    """One request at an exact version (the client otherwise uses its highest)."""
    saved = c.versions.get(api_key)
    c.versions[api_key] = version
    try:
        return c.request(api_key, **fields)
    finally:
        if saved is None:
            del c.versions[api_key]
        else:
            c.versions[api_key] = saved


class RawTxn:
    """One transactional producer spoken byte-exact: explicit id, epoch and sequences."""

    def __init__(self, c: Client, txn_id: str, timeout_ms: int = 30_000):
        self.c, self.txn_id, self.timeout_ms = c, txn_id, timeout_ms
        self.pid, self.epoch = -1, -1
        self.seq: dict[tuple[str, int], int] = {}

    def init(self, version: int = 4, timeout_ms: int | None = None) -> KafkaError:
        r = call(self.c, 22, version, transactional_id=self.txn_id,
                 transaction_timeout_ms=self.timeout_ms if timeout_ms is None else timeout_ms,
                 producer_id=-1, producer_epoch=-1)
        if r.error_code == 0:
            self.pid, self.epoch, self.seq = r.producer_id, r.producer_epoch, {}
        return E(r.error_code)

    def add(self, *tps: tuple[str, int], version: int = 3) -> dict[tuple[str, int], KafkaError]:
        T = request_class(24).AddPartitionsToTxnTopic
        by_topic: dict[str, list[int]] = {}
        for topic, partition in tps:
            by_topic.setdefault(topic, []).append(partition)
        r = call(self.c, 24, version, v3_and_below_transactional_id=self.txn_id,
                 v3_and_below_producer_id=self.pid, v3_and_below_producer_epoch=self.epoch,
                 v3_and_below_topics=[T(name=t, partitions=ps) for t, ps in by_topic.items()])
        return {(t.name, p.partition_index): E(p.partition_error_code)
                for t in r.results_by_topic_v3_and_below for p in t.results_by_partition}

    def add_offsets(self, group: str, version: int = 3) -> KafkaError:
        r = call(self.c, 25, version, transactional_id=self.txn_id, producer_id=self.pid,
                 producer_epoch=self.epoch, group_id=group)
        return E(r.error_code)

    def produce(self, topic: str, partition: int, *values: bytes) -> tuple[KafkaError, int]:
        seq = self.seq.get((topic, partition), 0)
        data = records.build_batch([(None, v) for v in values], producer_id=self.pid,
                                   producer_epoch=self.epoch, base_sequence=seq, transactional=True)
        err, base = self.c.produce(topic, partition, data, transactional_id=self.txn_id)
        if err == E.NONE:
            self.seq[(topic, partition)] = seq + len(values)
        return err, base

    def commit_offsets(self, group: str, offsets: dict[tuple[str, int], int], version: int = 3,
                       generation: int = -1, member: str = "") -> dict[tuple[str, int], KafkaError]:
        T = request_class(28).TxnOffsetCommitRequestTopic
        by_topic: dict[str, list] = {}
        for (topic, partition), off in offsets.items():
            by_topic.setdefault(topic, []).append(T.TxnOffsetCommitRequestPartition(
                partition_index=partition, committed_offset=off, committed_leader_epoch=-1,
                committed_metadata=""))
        fields = dict(transactional_id=self.txn_id, group_id=group, producer_id=self.pid,
                      producer_epoch=self.epoch, topics=[T(name=t, partitions=p) for t, p in by_topic.items()])
        if version >= 3:
            fields.update(generation_id=generation, member_id=member, group_instance_id=None)
        r = call(self.c, 28, version, **fields)
        return {(t.name, p.partition_index): E(p.error_code) for t in r.topics for p in t.partitions}

    def end(self, commit: bool, version: int = 3) -> KafkaError:
        r = call(self.c, 26, version, transactional_id=self.txn_id, producer_id=self.pid,
                 producer_epoch=self.epoch, committed=commit)
        return E(r.error_code)
