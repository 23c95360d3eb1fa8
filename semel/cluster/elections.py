"""Leader elections asked for by an operator or by the balance check (Kafka's ElectLeaders
and auto.leader.rebalance.enable), as pure decisions over one partition's state.

A partition's preferred leader is its first replica. Preferred election moves
leadership there only when that broker is live and in the ISR, so no acknowledged
write is lost. Unclean election is for a partition without a leader whose in-sync
replicas are all gone: it takes the first live replica even when it is out of the
ISR (acknowledged writes that replica lacks are lost), and only when asked for by
name, never on its own. Every change bumps the leader epoch, as the controller's
elections do, so the old leader is fenced and its followers truncate.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Iterable

from ..protocol.errors import KafkaError
from .state import NO_LEADER, ClusterView, PartitionState

log = logging.getLogger("semel.cluster.elections")

PREFERRED, UNCLEAN = 0, 1
CAS_TRIES = 5


def preferred(st: PartitionState, live: set[int]) -> PartitionState | KafkaError:
    """The state with the preferred replica leading, or why not."""
    want = st.replicas[0]
    if st.leader == want:
        return KafkaError.ELECTION_NOT_NEEDED
    if want not in live or want not in st.isr:
        return KafkaError.PREFERRED_LEADER_NOT_AVAILABLE
    return replace(st, leader=want, leader_epoch=st.leader_epoch + 1)


def unclean(st: PartitionState, live: set[int]) -> PartitionState | KafkaError:
    """A leader for a leaderless partition: a live in-sync replica when there is one,
    else the first live replica, which becomes the whole ISR."""
    if st.leader != NO_LEADER and st.leader in live:
        return KafkaError.ELECTION_NOT_NEEDED
    clean = [r for r in st.replicas if r in live and r in st.isr]
    if clean:
        return replace(st, leader=clean[0], leader_epoch=st.leader_epoch + 1,
                       isr=tuple(r for r in st.isr if r in live))
    out_of_sync = [r for r in st.replicas if r in live]
    if not out_of_sync:
        return KafkaError.ELIGIBLE_LEADERS_NOT_AVAILABLE
    return replace(st, leader=out_of_sync[0], leader_epoch=st.leader_epoch + 1, isr=(out_of_sync[0],))


ELECTIONS = {PREFERRED: preferred, UNCLEAN: unclean}


def leave_isr(st: PartitionState, node: int) -> PartitionState | None:
    """The state without `node` in the ISR, for a replica that may lack records it once
    reported to its leader (its last run ended in a crash without the durable flush
    policy, or its disk came back empty): out of the ISR it can be elected by no clean
    election, so it never leads over a replica that has what was acknowledged, and
    leaders take it back once it has caught up. Were it the leader of record, the
    partition is left leaderless (epoch + 1) for the controller to elect from the rest.
    The last member stays (the ISR is never empty: it is the last replica standing).
    None when nothing changes."""
    if node not in st.isr or len(st.isr) == 1:
        return None
    isr = tuple(r for r in st.isr if r != node)
    if st.leader == node:
        return replace(st, isr=isr, leader=NO_LEADER, leader_epoch=st.leader_epoch + 1)
    return replace(st, isr=isr)


def elect(st: PartitionState, live: Iterable[int], election_type: int) -> PartitionState | KafkaError:
    """The new state an election of `election_type` (0 preferred, 1 unclean) gives, or
    Kafka's error for the partition (INVALID_REQUEST for an unknown type)."""
    fn = ELECTIONS.get(election_type)
    if fn is None:
        return KafkaError.INVALID_REQUEST
    return fn(st, set(live))


def imbalanced(states: Iterable[PartitionState], live: Iterable[int], percentage: int) -> list[PartitionState]:
    """Kafka's leader balance check: a broker's imbalance is the share of partitions it
    prefers that another broker leads; where that share is above `percentage`, every such
    partition whose preferred replica can lead now (live, in the ISR) is returned for a
    preferred election. Brokers at or under the threshold are left alone, so one stray
    leader among many does not cause churn."""
    live = set(live)
    by_preferred: dict[int, list[PartitionState]] = {}
    for st in states:
        if st.replicas:
            by_preferred.setdefault(st.replicas[0], []).append(st)
    out: list[PartitionState] = []
    for broker, parts in sorted(by_preferred.items()):
        if broker not in live:
            continue
        elsewhere = [st for st in parts if st.leader != broker]
        if len(elsewhere) * 100 > percentage * len(parts):
            out.extend(st for st in elsewhere if isinstance(preferred(st, live), PartitionState))
    return out


async def run_election(view: ClusterView, topic: str, partition: int, election_type: int) -> KafkaError:
    """Decide and write one election by compare-and-set on the partition's version (see
    semel.cluster.controller), deciding again from etcd's state when the CAS loses to a
    leader's ISR change or the controller. `view` is an EtcdClusterView."""
    st = view.partition(topic, partition)
    for _ in range(CAS_TRIES):
        if st is None:
            return KafkaError.UNKNOWN_TOPIC_OR_PARTITION
        want = elect(st, view.brokers(), election_type)
        if isinstance(want, KafkaError):
            return want
        stored = await view.write_partition(st, want)
        if stored is not None:
            log.info("%s-%d: %s election, leader %d -> %d, epoch %d, isr %s", topic, partition,
                     "preferred" if election_type == PREFERRED else "unclean", st.leader, stored.leader,
                     stored.leader_epoch, list(stored.isr))
            return KafkaError.NONE
        st = await view.read_partition(topic, partition)
    return KafkaError.REQUEST_TIMED_OUT
