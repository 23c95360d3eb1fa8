"""acks=all for a coordinator's own log.

A coordinator applies and answers a transition once `flusher.sync` returns for its
record (semel.coordinator.coordinator_log). In a cluster its partition is replicated,
so "durable" must also mean "past the high watermark": a record only the leader holds
can vanish with it, and a decision answered from it could be contradicted by the next
coordinator. `ReplicatedFlusher` stands in for the broker's flusher for one
coordinator partition: the local fsync first (the broker's flush policy still
applies), then the replication wait. Anything short of that (leadership lost, the
ISR below min.insync.replicas, a timeout) raises AppendError with the reason, which
the coordinator log treats as a failed fsync: the record stays in the log but is
not answered as done.
"""
from __future__ import annotations

from typing import Callable

from ..protocol.errors import KafkaError
from ..storage.errors import AppendError


class ReplicatedFlusher:
    def __init__(self, inner, replicas: Callable[[], object], topic: str, partition: int, timeout_s: float):
        self.inner = inner
        self.replicas = replicas      # the broker's ReplicaManager, read at each wait (it starts later)
        self.topic, self.partition = topic, partition
        self.timeout_s = timeout_s

    async def sync(self, plog, upto_offset: int) -> None:
        if self.inner is not None:
            await self.inner.sync(plog, upto_offset)
        replicas = self.replicas()
        if replicas is None:
            raise AppendError(KafkaError.NOT_COORDINATOR, "replication is not running")
        err = await replicas.wait_for_hw(self.topic, self.partition, min(upto_offset, plog.log_end_offset),
                                         self.timeout_s)
        if err != KafkaError.NONE:
            raise AppendError(err, f"{self.topic}-{self.partition} up to {upto_offset} not replicated: {err.name}")
