"""A coordinator's seat on its replicated internal partition.

In a cluster, `__transaction_state` and `__consumer_offsets` are replicated topics and
the coordinator of each is the leader of its partition. This module decides, from the
partition states a broker sees, when that broker's coordinator loads its state, serves,
and drops it. It does no I/O: the coordinator runs the actions it returns.

The rules it enforces (docs/cluster.md, "What remains for coordinators"):

- A broker loads when it becomes the leader at a leader epoch newer than any it has
  loaded at; the coordinator epoch is that leader epoch, so it only grows across moves
  and markers from an older coordinator are fenced by producer state.
- It serves only once the load finished for the epoch it still leads at. A load that
  finishes after leadership moved on is discarded (`loaded` answers False). The load
  must also wait until the high watermark reaches the log end it replays up to
  (`may_finish_load`): a Prepare record the new leader holds but has not yet committed
  could still be lost with it, so rolling it forward (writing markers) could contradict
  a decision a later leader takes without it.
- On any other state (another leader, no leader, not a replica) it drops memory at once
  and answers NOT_COORDINATOR; a state older than one already seen (by version) is a
  late delivery and changes nothing.
- A write issued while serving at epoch e is answered only when the high watermark has
  passed it and the seat still serves at e (`answer_error`); otherwise NOT_COORDINATOR,
  and the client finds the coordinator again.

A follower never loads or rolls forward its replicated copy: only `lead` starts a load.
"""
from __future__ import annotations

from enum import Enum

from ..protocol.errors import KafkaError
from .state import PartitionState


class Seat(Enum):
    UNLOADED = "unloaded"   # not the coordinator: NOT_COORDINATOR
    LOADING = "loading"     # leader, replaying its log: COORDINATOR_LOAD_IN_PROGRESS
    LOADED = "loaded"       # the coordinator at `epoch`


# (state, event) -> next state. "lead": this broker leads at a newer epoch; "lose": any
# state in which it does not lead; "loaded": the load of the current epoch finished.
TRANSITIONS: dict[tuple[Seat, str], Seat] = {
    (Seat.UNLOADED, "lead"): Seat.LOADING,
    (Seat.LOADING, "lead"): Seat.LOADING,     # a newer epoch while loading: load again
    (Seat.LOADED, "lead"): Seat.LOADING,      # lost and regained between two deliveries
    (Seat.LOADING, "loaded"): Seat.LOADED,
    (Seat.UNLOADED, "lose"): Seat.UNLOADED,
    (Seat.LOADING, "lose"): Seat.UNLOADED,
    (Seat.LOADED, "lose"): Seat.UNLOADED,
}

ERRORS = {Seat.UNLOADED: KafkaError.NOT_COORDINATOR, Seat.LOADING: KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
          Seat.LOADED: KafkaError.NONE}

LOAD, UNLOAD = "load", "unload"

# Internal topics are replicated like any topic, up to this many replicas.
MAX_INTERNAL_REPLICATION = 3


def internal_replication_factor(live_brokers: int) -> int:
    """RF of an internal topic created now: min(3, live brokers), at least 1."""
    return max(1, min(MAX_INTERNAL_REPLICATION, live_brokers))


class IllegalSeatTransition(Exception):
    pass


class CoordinatorSeat:
    """One broker's seat for one internal partition."""

    def __init__(self, node_id: int):
        self.node_id = node_id
        self.state = Seat.UNLOADED
        self.epoch = -1          # the leader epoch being loaded or served (last one, once unloaded)
        self._version = -1       # the newest partition state seen, to ignore late deliveries

    def _move(self, event: str) -> None:
        nxt = TRANSITIONS.get((self.state, event))
        if nxt is None:
            raise IllegalSeatTransition(f"{event} in {self.state.value}")
        self.state = nxt

    def observe(self, st: PartitionState | None) -> tuple[str, int] | None:
        """A partition state this broker learnt of. Returns (LOAD, epoch) when the
        coordinator must load (dropping whatever it had first), (UNLOAD, epoch) when it
        must drop its state and fail what is in flight, None when nothing changes."""
        if st is not None:
            if st.version < self._version:
                return None
            self._version = st.version
        if st is not None and st.leader == self.node_id and self.node_id in st.replicas:
            if st.leader_epoch <= self.epoch:
                return None      # the same leadership (an ISR change), or an epoch already given up
            self._move("lead")
            self.epoch = st.leader_epoch
            return (LOAD, self.epoch)
        if self.state == Seat.UNLOADED:
            return None
        self._move("lose")
        return (UNLOAD, self.epoch)

    @staticmethod
    def may_finish_load(high_watermark: int, load_end: int) -> bool:
        """Whether a load replaying the log up to `load_end` may start serving: only once
        everything it replayed is committed."""
        return high_watermark >= load_end

    def loaded(self, epoch: int) -> bool:
        """The load for `epoch` finished. True: serve (and roll Prepare* forward) now;
        False: leadership moved on meanwhile, discard what was loaded."""
        if self.state != Seat.LOADING or self.epoch != epoch:
            return False
        self._move("loaded")
        return True

    def error(self) -> KafkaError:
        """What a coordinator request gets now (NONE: serve it)."""
        return ERRORS[self.state]

    def serving(self, epoch: int | None = None) -> bool:
        return self.state == Seat.LOADED and (epoch is None or epoch == self.epoch)

    def answer_error(self, epoch: int, high_watermark: int, end_offset: int) -> KafkaError | None:
        """For a write issued at `epoch` ending at `end_offset` (one past its record):
        NONE to apply and answer it, NOT_COORDINATOR if the seat was lost meanwhile,
        None to keep waiting for the high watermark."""
        if not self.serving(epoch):
            return KafkaError.NOT_COORDINATOR
        return KafkaError.NONE if high_watermark >= end_offset else None
