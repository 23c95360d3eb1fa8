"""Internal topics created in etcd at first use: replication factor min(3, live
brokers), created once when several brokers race, the coordinator is the live leader.
Real etcd process, one per module."""
from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from tests.support.etcd_views import run_views

from semel.cluster.internal_topics import coordinator_node, ensure_internal_topic
from semel.cluster.state import NO_LEADER, BrokerInfo, MemoryClusterView
from semel.protocol.errors import KafkaError

CONFIGS = {"cleanup.policy": "compact", "retention.ms": "-1"}


def run(etcd, nodes, body):
    return run_views(etcd, "internal-topics", nodes, body, all_registered=True)


@pytest.mark.parametrize("nodes, rf", [((0,), 1), ((0, 1), 2), ((0, 1, 2, 3), 3)])
def test_created_once_with_rf_min_3_live(etcd, nodes, rf):
    async def body(views):
        results = await asyncio.gather(*(ensure_internal_topic(v, "__consumer_offsets", CONFIGS) for v in views))
        states = [r for r in results if not isinstance(r, KafkaError)]
        assert states, results
        assert all(r == KafkaError.COORDINATOR_NOT_AVAILABLE for r in results if isinstance(r, KafkaError))
        assert len({(s.replicas, s.leader) for s in states}) == 1, "one creation won"
        st = states[0]
        assert len(st.replicas) == rf and st.leader == st.replicas[0] and st.leader_epoch == 0
        for v in views:   # a broker that lost the race sees the winner's topic through its watch
            for _ in range(400):
                if v.partition("__consumer_offsets", 0) is not None:
                    break
                await asyncio.sleep(0.05)
            assert v.topics()["__consumer_offsets"].configs == CONFIGS
            assert coordinator_node(v, "__consumer_offsets") == st.leader
            again = await ensure_internal_topic(v, "__consumer_offsets", {"other": "x"})
            assert again == v.partition("__consumer_offsets", 0) and again.replicas == st.replicas
    run(etcd, nodes, body)


def test_no_coordinator_before_creation(etcd):
    async def body(views):
        assert coordinator_node(views[0], "__transaction_state") is None
    run(etcd, (0,), body)


def test_coordinator_is_the_live_leader_only():
    table = MemoryClusterView.table()
    view = MemoryClusterView(table, 0, BrokerInfo(0, "127.0.0.1", 9000))
    MemoryClusterView(table, 1, BrokerInfo(1, "127.0.0.1", 9001))
    table.create_topic("__transaction_state", [(2, 0, 1)])     # broker 2 not registered
    assert coordinator_node(view, "__transaction_state") is None
    table.set_leader("__transaction_state", 0, 1)
    assert coordinator_node(view, "__transaction_state") == 1
    table._publish(replace(view.partition("__transaction_state", 0), leader=NO_LEADER))
    assert coordinator_node(view, "__transaction_state") is None
