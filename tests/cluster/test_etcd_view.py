"""EtcdClusterView against a real etcd process: compare-and-set on partition state,
the leader-only ISR rule, producer-id blocks under contention, broker sessions that
end with their lease, and the controller seat. Each test uses its own cluster id,
so one etcd serves the whole module."""
from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace

import pytest

from tests.support.etcd_views import run_views

from semel.cluster.etcd import Etcd, EtcdError
from semel.cluster.metadata import EtcdClusterView
from semel.cluster.state import BrokerInfo
from semel.protocol.errors import KafkaError

_ids = itertools.count()


def run(etcd, nodes, body, ttl=6):
    return run_views(etcd, "view-run", nodes, body, ttl=ttl)


async def settle(check, what, timeout_s=20.0):
    """Wait for a state the watch delivers on its own (liveness, not timing)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.05)


def test_partition_changes_are_compare_and_set(etcd):
    async def body(views):
        a, b = views
        assert await a.create_topic("t", [(0, 1), (1, 0)], {"retention.ms": "1000"}) == KafkaError.NONE
        assert await b.create_topic("t", [(1,)], {}) == KafkaError.TOPIC_ALREADY_EXISTS
        await settle(lambda: b.partition("t", 1) is not None, "b sees the topic")
        assert b.topics()["t"].configs == {"retention.ms": "1000"}
        st = b.partition("t", 0)
        assert (st.replicas, st.leader, st.leader_epoch, st.isr) == ((0, 1), 0, 0, (0, 1))
        # Both decide on the same version: exactly one write lands.
        first = await a.write_partition(st, replace(st, leader=1, leader_epoch=1))
        second = await b.write_partition(st, replace(st, leader=0, leader_epoch=1, isr=(0,)))
        assert first is not None and second is None
        assert first.version > st.version
        await settle(lambda: b.partition("t", 0).version == first.version, "the write reaches b's cache")
        assert b.partition("t", 0).leader == 1
    run(etcd, [0, 1], body)


def test_only_the_current_leader_may_alter_the_isr(etcd):
    async def body(views):
        a, b = views
        seen = []
        b.add_listener(seen.append)
        await a.create_topic("t", [(0, 1)], {})
        st = a.partition("t", 0)
        assert await b.alter_isr(st, (0,)) is None            # b does not lead it
        assert await a.alter_isr(st, ()) is None               # an empty ISR
        assert await a.alter_isr(st, (0, 7)) is None           # 7 is no replica
        shrunk = await a.alter_isr(st, (0,))
        assert shrunk.isr == (0,) and shrunk.leader_epoch == st.leader_epoch
        assert await a.alter_isr(st, (0, 1)) is None           # decided on a stale version
        grown = await a.alter_isr(shrunk, (0, 1))
        assert grown.isr == (0, 1)
        await settle(lambda: any(s.version == grown.version for s in seen), "b's listener hears it")
    run(etcd, [0, 1], body)


def test_producer_id_blocks_never_overlap(etcd):
    async def body(views):
        firsts = await asyncio.gather(*(v.allocate_producer_ids(100) for v in views for _ in range(5)))
        assert len(set(firsts)) == 15
        ranges = sorted((f, f + 100) for f in firsts)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(ranges, ranges[1:]))
    run(etcd, [0, 1, 2], body)


def test_a_broker_that_stops_refreshing_leaves_and_the_seat_moves(etcd):
    async def body(views):
        a, b = views
        await settle(lambda: set(b.brokers()) == {0, 1}, "both brokers live")
        assert await a.try_become_controller()
        assert not await b.try_become_controller()
        await settle(lambda: b.controller_id() == 0, "b sees a as controller")
        # a goes silent (as if SIGSTOPped): no keepalive, its lease runs out.
        for t in a._tasks:
            t.cancel()
        await settle(lambda: set(b.brokers()) == {1} and b.controller_id() is None,
                     "a's broker key and controller seat expire with its lease")
        assert await b.try_become_controller()
        await settle(lambda: b.controller_id() == 1, "b holds the seat")
    run(etcd, [0, 1], body, ttl=2)


def test_unreachable_etcd_is_an_error_value_not_a_hang(etcd):
    async def body():
        client = Etcd("127.0.0.1:1", timeout_s=1)
        try:
            with pytest.raises(EtcdError, match="no etcd endpoint answered"):
                await client.get("/x")
        finally:
            await client.close()
    asyncio.run(body())


def _view(etcd, cluster_id, node, ttl=2):
    return EtcdClusterView(Etcd(etcd.endpoint), cluster_id, node, BrokerInfo(node, "127.0.0.1", 9000 + node), ttl)


def test_a_restart_within_the_ttl_waits_for_the_old_session_to_end(etcd):
    """Kafka's registration rule: the others see the old session end (and elect) first."""
    cluster_id = f"view-test-{next(_ids)}"

    async def go():
        old, watcher = _view(etcd, cluster_id, 0), _view(etcd, cluster_id, 1)
        await old.start()
        await watcher.start()
        seen = []
        watcher.add_change_listener(lambda: seen.append(set(watcher.brokers())))
        await settle(lambda: set(watcher.brokers()) == {0, 1}, "both registered")
        for t in old._tasks:     # SIGKILLed: no more keepalives, the lease still runs
            t.cancel()
        new = _view(etcd, cluster_id, 0)
        await new.start()        # returns only once the old session is gone
        try:
            await settle(lambda: set(watcher.brokers()) == {0, 1}, "the new session registered")
            assert {1} in seen   # the watcher saw broker 0 leave before it came back
            assert (await new.etcd.get(new.keys.broker(0))).lease == new.lease
        finally:
            await new.stop()
            await watcher.stop()
            await old.etcd.close()
    asyncio.run(go())


def test_a_second_live_broker_with_the_same_node_id_is_refused(etcd):
    cluster_id = f"view-test-{next(_ids)}"

    async def go():
        first, second = _view(etcd, cluster_id, 0), _view(etcd, cluster_id, 0)
        await first.start()
        try:
            with pytest.raises(ValueError, match="node id 0 is registered by a live broker"):
                await second.start()
            assert set(first.brokers()) == {0}
        finally:
            await second.etcd.close()
            await first.stop()
    asyncio.run(go())
