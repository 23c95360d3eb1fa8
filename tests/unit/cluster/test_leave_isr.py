"""The rule a broker that may have lost reported records applies to each partition
before it registers (elections.leave_isr), checked over every small state; and how a
data directory tells how its last run ended (LogManager.last_stop)."""
from __future__ import annotations

import itertools

from semel.cluster.controller import decide
from semel.cluster.elections import leave_isr
from semel.cluster.state import NO_LEADER, PartitionState
from semel.storage import LogManager
from semel.storage.manager import CLEAN, NEW, UNCLEAN

REPLICAS = (0, 1, 2)


def states():
    for n in range(1, 4):
        for isr in itertools.permutations(REPLICAS, n):
            for leader in (NO_LEADER,) + REPLICAS:
                yield PartitionState("t", 0, REPLICAS, leader, 5, tuple(sorted(isr)), 1)


def test_leave_isr_keeps_the_node_out_of_every_election_unless_it_is_the_last_member():
    for st in states():
        for node in REPLICAS:
            new = leave_isr(st, node)
            if node not in st.isr or st.isr == (node,):
                assert new is None
                continue
            assert node not in new.isr and new.isr and set(new.isr) < set(st.isr)
            assert new.leader != node
            assert new.leader_epoch == st.leader_epoch + (1 if st.leader == node else 0)
            # Whoever the controller then elects, with every broker live, it is not this node.
            chosen = decide(new, set(REPLICAS)) or new
            assert chosen.leader != node


def test_last_stop_tells_new_clean_and_unclean(tmp_path):
    logs = LogManager(tmp_path)
    assert logs.last_stop == NEW
    logs.create_topic("t", 1)
    logs.close()
    logs = LogManager(tmp_path)
    assert logs.last_stop == CLEAN
    # A run that ends without close() (a crash) reads as unclean, even with no write since.
    logs = LogManager(tmp_path)
    assert logs.last_stop == UNCLEAN
    logs.close()
    assert LogManager(tmp_path).last_stop == CLEAN
