"""The cluster's share state in a real etcd (semel.cluster.share_store) under the cluster
coordinator that uses it (semel.coordinator.share_leaders): a leader claims a
partition's share state at its leader epoch, and once a newer leader has claimed it,
the deposed one can neither write nor claim it back; what the new leader reads is
exactly what was acknowledged, acquisitions left out."""
from __future__ import annotations

import asyncio
import uuid

from semel.cluster.etcd import Etcd
from semel.cluster.share_store import EtcdShareStore
from semel.coordinator.share_leaders import LeaderShareCoordinator
from semel.coordinator.share_partition import ACK_ACCEPT, AVAILABLE
from semel.protocol.errors import KafkaError


def _leader(etcd_proc, root: str) -> LeaderShareCoordinator:
    return LeaderShareCoordinator(EtcdShareStore(Etcd(etcd_proc.endpoint), root), clock=lambda: 1000)


async def _acked_then_held(share: LeaderShareCoordinator, group: str) -> KafkaError:
    """Acquire offsets 0..9, accept 0..4 and write; then acquire 10..11 (not written)."""
    sp = share.share_partition(group, "t", 0, lambda reset: 0)
    limits = share.state.limits(group)
    sp.acquire("m", 12, 10, share.clock(), limits)
    assert sp.acknowledge("m", 0, 4, [ACK_ACCEPT], limits) == KafkaError.NONE
    err = await share.persist(share.partition_records(group, [("t", 0)]))
    sp.acquire("m", 12, 10, share.clock(), limits)
    return err


def test_a_deposed_leader_cannot_write_and_the_new_one_reads_what_was_acknowledged(etcd):
    root = f"/semel/share-store-{uuid.uuid4().hex[:6]}/"

    async def body():
        old, new = _leader(etcd, root), _leader(etcd, root)
        try:
            assert await old.prepare("g", {("t", 0): 3}) == {}
            assert await _acked_then_held(old, "g") == KafkaError.NONE
            assert await new.prepare("g", {("t", 0): 4}) == {}
            sp = new.state.partition("g", "t", 0)
            assert sp is not None and (sp.start, sp.end) == (5, 10)   # 10, 11 were only acquired
            assert {off: (r.state, r.count) for off, r in sp.records.items()} == \
                {off: (AVAILABLE, 1) for off in range(5, 10)}
            # the deposed leader still answers: its acknowledgement is refused, not lost in silence
            limits = old.state.limits("g")
            assert old.state.partition("g", "t", 0).acknowledge("m", 5, 9, [ACK_ACCEPT], limits) == KafkaError.NONE
            assert await old.persist(old.partition_records("g", [("t", 0)])) == KafkaError.NOT_LEADER_OR_FOLLOWER
            assert await old.store.claim("t", 0, 3) == KafkaError.NOT_LEADER_OR_FOLLOWER
            again = _leader(etcd, root)
            assert await again.prepare("g", {("t", 0): 4}) == {}
            assert (again.state.partition("g", "t", 0).start, again.state.partition("g", "t", 0).end) == (5, 10)
            await again.store.etcd.close()
        finally:
            await old.store.etcd.close()
            await new.store.etcd.close()

    asyncio.run(body())


def test_configs_set_at_one_broker_reach_another(etcd):
    root = f"/semel/share-store-{uuid.uuid4().hex[:6]}/"

    async def body():
        a, b = _leader(etcd, root), _leader(etcd, root)
        try:
            err, _ = await a.alter_configs("g", {"share.auto.offset.reset": "earliest"}, False)
            assert err == KafkaError.NONE
            assert b.state.config("g", "share.auto.offset.reset") == "latest"
            await b.refresh_configs("g")
            assert b.state.config("g", "share.auto.offset.reset") == "earliest"
        finally:
            await a.store.etcd.close()
            await b.store.etcd.close()

    asyncio.run(body())
