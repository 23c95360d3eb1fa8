"""`EtcdShareStore`: a cluster's share-group state in etcd (semel.coordinator.ports.
ShareStore).

Why etcd and not a replicated internal topic: the state of a share-partition is read
by whichever broker leads the partition next, and etcd is where the cluster already
keeps what every broker must agree on (partition leaders and epochs). A write is one
etcd transaction: durable (etcd's raft log, fsynced on a quorum) before it answers,
and fenced, so a deposed leader cannot write over its successor. Only
acknowledgements and new share-partitions are written (one transaction per request
and partition touched), never acquisitions.

Keys under `/semel-share/<cluster-id>/` (outside the root every broker watches):
  share/<topic>/<partition>/<group>   a share-partition: {"start", "end", "runs"}
  share-claims/<topic>/<partition>    the leader epoch that owns those (zero-padded,
                                      so etcd compares it as a number)
  share-configs/<group>               a share group's config overrides
"""
from __future__ import annotations

import json
import logging

from ..protocol.errors import KafkaError
from .etcd import Etcd, EtcdError, Json, b64, delete_op, delete_prefix_op, mod_equals, put_op

log = logging.getLogger("semel.cluster.share_store")

_EPOCH_DIGITS = 12


def _epoch(value: int) -> bytes:
    return str(value).zfill(_EPOCH_DIGITS).encode()


def _value_equals(key: str, value: bytes) -> Json:
    return {"key": b64(key), "target": "VALUE", "result": "EQUAL", "value": b64(value)}


def forget_topic_ops(share_root: str, topic: str) -> list[Json]:
    """The etcd operations that drop every share group's state of `topic` (it is deleted:
    a topic created again under its name starts with none)."""
    return [delete_prefix_op(f"{share_root}share/{topic}/"), delete_prefix_op(f"{share_root}share-claims/{topic}/")]


class EtcdShareStore:
    def __init__(self, etcd: Etcd, root: str) -> None:
        self.etcd = etcd
        self.root = root

    def path(self, key: bytes) -> str:
        """The etcd key of a share coordinator record's key."""
        k = json.loads(key)
        if k.get("k") == "partition":
            return f"{self.root}share/{k['t']}/{int(k['p'])}/{k['g']}"
        return f"{self.root}share-configs/{k['g']}"

    def claim_key(self, topic: str, partition: int) -> str:
        return f"{self.root}share-claims/{topic}/{partition}"

    async def claim(self, topic: str, partition: int, leader_epoch: int) -> KafkaError:
        key = self.claim_key(topic, partition)
        try:
            for _ in range(5):   # a race with another claimant: read again
                kv = await self.etcd.get(key)
                held = int(kv.value) if kv is not None else -1
                if held > leader_epoch:
                    return KafkaError.NOT_LEADER_OR_FOLLOWER
                if held == leader_epoch:
                    return KafkaError.NONE
                if await self.etcd.cas(key, _epoch(leader_epoch), kv.mod_revision if kv else 0) is not None:
                    return KafkaError.NONE
        except EtcdError as exc:
            log.warning("share state of %s-%d not claimed: %s", topic, partition, exc)
            return KafkaError.REQUEST_TIMED_OUT
        return KafkaError.NOT_LEADER_OR_FOLLOWER

    async def read(self, key: bytes) -> bytes | None:
        """The record's value; EtcdError (a ConnectionError) when etcd does not answer."""
        kv = await self.etcd.get(self.path(key))
        return kv.value if kv is not None else None

    async def write(self, pairs: list[tuple[bytes, bytes | None]], fences: dict[tuple[str, int], int]) -> KafkaError:
        if not pairs:
            return KafkaError.NONE
        compare = [_value_equals(self.claim_key(t, p), _epoch(e)) if e >= 0 else mod_equals(self.claim_key(t, p), 0)
                   for (t, p), e in sorted(fences.items())]
        ops = [put_op(self.path(k), v) if v is not None else delete_op(self.path(k)) for k, v in pairs]
        try:
            ok, _ = await self.etcd.txn(compare, ops)
        except EtcdError as exc:
            log.warning("share state not written: %s", exc)
            return KafkaError.REQUEST_TIMED_OUT
        return KafkaError.NONE if ok else KafkaError.NOT_LEADER_OR_FOLLOWER
