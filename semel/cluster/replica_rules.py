"""The leader's and the follower's replication decisions as pure functions: who is in
the ISR, where the high watermark is, where a follower's log diverged from its
leader's and where it cuts. No I/O, no asyncio: semel.cluster.replica_manager and
semel.cluster.replica_fetcher act on what these decide.

Kafka's rules:
- Leader: a follower's fetch offset is its log end; the high watermark is the
  smallest log end over the ISR and only grows (`high_watermark`). A follower that
  has not caught up for replica_lag_time_max_ms leaves the ISR; one that reaches the
  high watermark joins again (`isr_change`).
- Follower: where the logs diverged (a leader change), the leader answers a fetch
  with a diverging epoch (`diverging_epoch`, KIP-320/KIP-595) and the follower
  truncates by it (`truncation_point`, KIP-279).
- Either side fences a request made at another leader epoch (`leader_epoch_error`,
  KIP-320); a client's request goes to the leader the view names (`check_leader`).
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..protocol.errors import KafkaError
from .state import NO_LEADER, ClusterView, PartitionState

if TYPE_CHECKING:
    from ..storage.leader_epoch import LeaderEpochCache

UNDEFINED = -1

TopicPartition = tuple[str, int]


def leader_epoch_error(asked: int, known: int) -> KafkaError:
    """The asker's leader epoch against the one known here (-1 asked: any). Older is
    FENCED_LEADER_EPOCH (the asker must refresh), newer UNKNOWN_LEADER_EPOCH (this
    broker must catch up)."""
    if 0 <= asked < known:
        return KafkaError.FENCED_LEADER_EPOCH
    if asked > known:
        return KafkaError.UNKNOWN_LEADER_EPOCH
    return KafkaError.NONE


def min_insync_of(topic_config: Mapping[str, str] | None, default: int) -> int:
    """The topic's min.insync.replicas, or the broker's default when it sets none."""
    value = topic_config.get("min.insync.replicas") if topic_config is not None else None
    return int(value) if value is not None else default


def append_error(acks: int, isr: int, min_isr: int) -> KafkaError:
    """May a leader whose ISR has `isr` members take a produce with `acks`? acks=all
    (-1) needs at least min.insync.replicas in the ISR, whatever the replicas are."""
    return KafkaError.NOT_ENOUGH_REPLICAS if acks == -1 and isr < min_isr else KafkaError.NONE


def not_enough_replicas_message(topic: str, replicas: int, isr: int, min_isr: int) -> str:
    """What a refused acks=all write tells its producer (Produce v8+ carries it): the
    numbers behind NOT_ENOUGH_REPLICAS. A client only retries that error, until its
    delivery timeout, so a topic that can never have enough replicas says so, with the
    ways out."""
    why = (f"topic {topic} has replication factor {replicas} and min.insync.replicas {min_isr}; "
           f"{isr} replica(s) in sync")
    if replicas < min_isr:
        return f"{why}: acks=all can never succeed on it ({below_min_isr_way_out(replicas, min_isr)})"
    return f"{why}: acks=all waits until {min_isr} are in sync"


def below_min_isr_way_out(replicas: int, min_isr: int) -> str:
    """What a topic whose replication factor is below its min.insync.replicas can do."""
    return (f"recreate it with replication factor >= {min_isr}, set its min.insync.replicas to "
            f"{replicas} or less, or produce with acks=1")


def check_leader(view: ClusterView, topic: str, partition: int, current_leader_epoch: int = -1) -> KafkaError:
    """May this broker (its cluster `view`) serve the partition as its leader?

    Kafka's order: the client's leader epoch first (`leader_epoch_error`), then
    leadership itself (NOT_LEADER_OR_FOLLOWER sends the client to Metadata).
    """
    st = view.partition(topic, partition)
    if st is None:
        return KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    err = leader_epoch_error(current_leader_epoch, st.leader_epoch)
    if err:
        return err
    if st.leader != view.node_id:
        return KafkaError.NOT_LEADER_OR_FOLLOWER
    return KafkaError.NONE


@dataclass
class FollowerProgress:
    """What a leader knows of one follower: its log end and when it was last caught up."""
    leo: int = UNDEFINED
    last_caught_up_ms: float = 0.0
    last_fetch_ms: float = 0.0
    last_fetch_leader_leo: int = UNDEFINED
    # When it last left the ISR: it may join again only on a fetch made after that, as
    # in Kafka, where expansion is decided on a fetch. Without it a follower SIGKILLed on
    # an idle partition still looked caught up (its last fetch reached the log end) and
    # the leader put it back every ISR check until replica_lag_time_max_ms ran out,
    # holding the high watermark each time.
    left_isr_ms: float = 0.0

    def on_fetch(self, fetch_offset: int, leader_leo: int, now_ms: float) -> None:
        """Kafka's rule: caught up now if the fetch reaches the leader's log end; caught up
        at the previous fetch if it reaches what the log end was then (a follower chasing
        a busy leader is never exactly at the end, yet keeps up)."""
        if fetch_offset >= leader_leo:
            self.last_caught_up_ms = now_ms
        elif fetch_offset >= self.last_fetch_leader_leo >= 0:
            self.last_caught_up_ms = max(self.last_caught_up_ms, self.last_fetch_ms)
        self.leo = fetch_offset
        self.last_fetch_ms, self.last_fetch_leader_leo = now_ms, leader_leo


def high_watermark(current_hw: int, leader: int, leader_leo: int, isr: tuple[int, ...],
                   progress: dict[int, FollowerProgress]) -> int:
    """Smallest log end over the ISR; never below the current high watermark."""
    leos = [leader_leo if r == leader else progress[r].leo if r in progress else UNDEFINED for r in isr]
    return max(current_hw, min(leos, default=leader_leo))


def isr_change(state: PartitionState, leader_leo: int, hw: int, progress: dict[int, FollowerProgress],
               now_ms: float, lag_max_ms: int, epoch_start: int,
               alive: Collection[int] | None = None) -> tuple[int, ...] | None:
    """The ISR the leader should ask for, or None when it should stay as it is.

    Out: members other than the leader not caught up within lag_max_ms. In: replicas
    whose log end reached the high watermark and the start of the leader's epoch
    (Kafka's conditions), caught up within lag_max_ms, and registered as alive when
    `alive` (broker ids) is given: a broker whose session ended may still fetch for a
    moment while it shuts down, and taking it back in would hold the high watermark
    (and every acks=all answer) until lag_max_ms dropped it again (KIP-841: no ISR
    expansion to a fenced broker). The leader always stays, so the ISR is never
    empty. Order follows the replica list."""
    def fresh(r: int) -> bool:
        p = progress.get(r)
        return p is not None and now_ms - p.last_caught_up_ms <= lag_max_ms

    def joins(r: int) -> bool:
        p = progress.get(r)
        return (p is not None and p.leo >= max(hw, epoch_start) and fresh(r)
                and p.last_fetch_ms >= p.left_isr_ms and (alive is None or r in alive))

    keep = {r for r in state.isr if r == state.leader or fresh(r)}
    add = {r for r in state.replicas if r not in state.isr and joins(r)}
    new = tuple(r for r in state.replicas if r in keep | add | {state.leader})
    return None if set(new) == set(state.isr) else new


def truncation_point(epochs: LeaderEpochCache, log_end: int, hw: int, leader_epoch: int, end_offset: int) -> tuple[int, bool]:
    """Where a follower cuts its log, given the leader's answer (leader_epoch, end_offset)
    to "where does my latest epoch end?", and whether it is done (KIP-279).

    The answer names the largest epoch the leader has at or below the one asked; the
    follower keeps what both agree on: up to the smaller of the two ends of that epoch.
    When the follower lacks that epoch itself, it cuts to where its own history above
    it begins and asks again with its then latest epoch. No common epoch at all (an
    undefined answer): keep what is committed, the high watermark (Kafka's fallback)."""
    if leader_epoch == UNDEFINED or end_offset == UNDEFINED:
        return min(hw, log_end), True
    mine, my_end = epochs.end_offset_for(leader_epoch, log_end)
    if mine == UNDEFINED:
        return min(end_offset, log_end), True
    return min(end_offset, my_end), mine == leader_epoch


def diverging_epoch(epochs: LeaderEpochCache, log_start: int, log_end: int, fetch_offset: int,
                    last_fetched_epoch: int) -> tuple[int, int] | KafkaError | None:
    """The leader's check of a follower's fetch (KIP-320/KIP-595): None when the follower's
    log up to fetch_offset can continue the leader's; else (epoch, end offset), the
    largest epoch the leader has at or below the follower's last one and where it ends
    here, for the follower to truncate by; OFFSET_OUT_OF_RANGE when the leader knows no
    such epoch. No epoch given (an empty log) or an offset below the log start: the
    read itself decides."""
    if last_fetched_epoch < 0 or fetch_offset < log_start:
        return None
    epoch, end = epochs.end_offset_for(last_fetched_epoch, log_end)
    if epoch == UNDEFINED or end == UNDEFINED:
        return KafkaError.OFFSET_OUT_OF_RANGE
    if epoch < last_fetched_epoch or end < fetch_offset:
        return epoch, end
    return None



def hand_over(state: PartitionState, new_isr: tuple[int, ...], min_isr: int,
              alive: Collection[int]) -> PartitionState | None:
    """Instead of shrinking the ISR to `new_isr`, the state that moves leadership away, or
    None to shrink as asked.

    A leader about to be left alone in its ISR, below `min_isr`, hears none of its in-sync
    followers. When they are still registered (alive: broker ids), and with the other
    registered replicas are at least `min_isr`, the leader is most likely the one cut off:
    shrinking would keep every acks=all producer on NOT_ENOUGH_REPLICAS for as long as
    the cut lasts, where they can take writes together. Leadership goes to the first of
    them in replica order, at a new epoch, with an ISR of exactly them: each was in the
    ISR, so holds everything up to the high watermark (every acknowledged write); the
    other replicas, the old leader too, join again by catching up. Only a leader that is
    alone hands over, so one that still hears a follower shrinks as before; the caller
    waits first until a follower that died would have left the registrations (its lease
    ended), so leadership is not handed to a dead broker."""
    if min_isr <= 1 or state.leader == NO_LEADER or tuple(new_isr) != (state.leader,):
        return None
    alive = set(alive)
    others = tuple(r for r in state.replicas if r in state.isr and r != state.leader)
    if not others or not all(r in alive for r in others):
        return None
    if sum(1 for r in state.replicas if r != state.leader and r in alive) < min_isr:
        return None
    return replace(state, leader=others[0], leader_epoch=state.leader_epoch + 1, isr=others)
