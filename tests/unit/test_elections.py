"""Leader elections asked for by an operator or the balance check (semel.cluster.elections),
checked over every small partition state: who may lead after each kind of election."""
from __future__ import annotations

from itertools import combinations, permutations

from semel.cluster.elections import PREFERRED, UNCLEAN, elect, imbalanced
from semel.cluster.state import NO_LEADER, PartitionState
from semel.protocol.errors import KafkaError

BROKERS = (0, 1, 2)


def subsets(items):
    return [set(c) for n in range(len(items) + 1) for c in combinations(items, n)]


def states():
    """Every partition of three replicas: any order, any leader, any non-empty ISR."""
    for replicas in permutations(BROKERS):
        for leader in (NO_LEADER, *BROKERS):
            for isr in subsets(BROKERS):
                if isr and (leader == NO_LEADER or leader in isr):
                    yield PartitionState("t", 0, replicas, leader, 4, tuple(r for r in replicas if r in isr))


def test_preferred_election_moves_only_to_a_live_in_sync_preferred_replica():
    for st in states():
        for live in subsets(BROKERS):
            got = elect(st, live, PREFERRED)
            pref = st.replicas[0]
            if st.leader == pref:
                assert got == KafkaError.ELECTION_NOT_NEEDED
            elif pref in live and pref in st.isr:
                assert (got.leader, got.leader_epoch, got.isr) == (pref, 5, st.isr)
            else:
                assert got == KafkaError.PREFERRED_LEADER_NOT_AVAILABLE


def test_unclean_election_prefers_the_isr_and_takes_an_out_of_sync_replica_only_when_none_is_live():
    for st in states():
        for live in subsets(BROKERS):
            got = elect(st, live, UNCLEAN)
            if st.leader != NO_LEADER and st.leader in live:
                assert got == KafkaError.ELECTION_NOT_NEEDED
            elif not live:
                assert got == KafkaError.ELIGIBLE_LEADERS_NOT_AVAILABLE
            elif set(st.isr) & live:
                assert got.leader in st.isr and got.leader in live and set(got.isr) == set(st.isr) & live
                assert got.leader_epoch == 5
            else:
                first_live = next(r for r in st.replicas if r in live)
                assert (got.leader, got.isr, got.leader_epoch) == (first_live, (first_live,), 5)


def test_an_unknown_election_type_is_an_invalid_request():
    st = PartitionState("t", 0, (0, 1), 1, 0, (0, 1))
    assert elect(st, {0, 1}, 7) == KafkaError.INVALID_REQUEST


def _parts(leaders: list[int], n: int = 3) -> list[PartitionState]:
    """Partition i prefers broker i % n and is led by leaders[i], all replicas in sync."""
    out = []
    for i, leader in enumerate(leaders):
        replicas = tuple((i + k) % n for k in range(n))
        out.append(PartitionState("t", i, replicas, leader, 0, replicas))
    return out


def test_balance_check_moves_leaders_back_only_above_the_threshold():
    # Broker 0 prefers 10 partitions; one led elsewhere is 10%: not above 10, left alone.
    leaders = [i % 3 for i in range(30)]
    leaders[0] = 1
    assert imbalanced(_parts(leaders), BROKERS, 10) == []
    # Two of its ten led elsewhere (20%): both go back.
    leaders[3] = 2
    assert [st.partition for st in imbalanced(_parts(leaders), BROKERS, 10)] == [0, 3]
    # A dead preferred broker, or one out of the ISR, gets nothing back.
    assert imbalanced(_parts(leaders), {1, 2}, 10) == []
    parts = _parts(leaders)
    parts[0] = PartitionState("t", 0, parts[0].replicas, 1, 0, (1, 2))
    assert [st.partition for st in imbalanced(parts, BROKERS, 10)] == [3]
