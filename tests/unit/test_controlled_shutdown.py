"""What a broker going away asks for each partition (semel.cluster.shutdown.handoff),
over every small partition state."""
from __future__ import annotations

from itertools import permutations

from semel.cluster.shutdown import handoff
from semel.cluster.state import NO_LEADER, PartitionState
from tests.unit.test_elections import BROKERS, states, subsets

ME = 0


def test_leadership_goes_to_an_in_sync_live_peer_and_the_broker_leaves_every_isr():
    for st in states():
        for live in subsets(BROKERS):
            live |= {ME}
            got = handoff(st, ME, live)
            peers = [r for r in st.isr if r != ME and r in live]
            if st.leader == ME:
                if not peers:
                    assert got is None          # nobody can take it: kept to the end
                    continue
                assert got.leader == next(r for r in st.replicas if r in peers)
                assert got.leader_epoch == st.leader_epoch + 1 and ME not in got.isr
                assert set(got.isr) == set(peers)
            elif ME in st.isr and st.leader != NO_LEADER:
                assert got.leader == st.leader and got.leader_epoch == st.leader_epoch
                assert got.isr == tuple(r for r in st.isr if r != ME) and st.leader in got.isr
            else:
                assert got is None
            if got is not None:      # applying it again asks for nothing more
                assert handoff(got, ME, live) is None


def test_a_partition_without_this_broker_is_left_alone():
    for replicas in permutations((1, 2)):
        st = PartitionState("t", 0, replicas, replicas[0], 3, replicas)
        assert handoff(st, ME, {0, 1, 2}) is None
