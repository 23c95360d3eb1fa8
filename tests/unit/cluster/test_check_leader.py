"""check_leader, a cluster member's answer to the handlers' question before they touch a
partition's log (ReplicaManager.leader_error): given only the broker's cluster view, may
this broker serve the partition as its leader at the epoch the client names?"""
from __future__ import annotations

from semel.cluster.replica_rules import check_leader
from semel.cluster.state import MemoryClusterView
from semel.protocol.errors import KafkaError


def test_leadership_and_the_clients_leader_epoch():
    table = MemoryClusterView.table()
    here, there = MemoryClusterView(table, 0), MemoryClusterView(table, 1)
    table.create_topic("t", [(0, 1)])
    table.set_leader("t", 0, 0)                      # leader 0 at epoch 1
    assert check_leader(here, "t", 0) is KafkaError.NONE
    assert check_leader(here, "t", 0, 1) is KafkaError.NONE
    assert check_leader(here, "t", 1) is KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    assert check_leader(here, "t", 0, 0) is KafkaError.FENCED_LEADER_EPOCH
    assert check_leader(here, "t", 0, 2) is KafkaError.UNKNOWN_LEADER_EPOCH
    assert check_leader(there, "t", 0) is KafkaError.NOT_LEADER_OR_FOLLOWER
    # The epoch comes first: a follower asked at an older epoch says FENCED, not NOT_LEADER.
    assert check_leader(there, "t", 0, 0) is KafkaError.FENCED_LEADER_EPOCH
