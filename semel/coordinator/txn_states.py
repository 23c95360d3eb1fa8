"""Transaction states, their transition table, and the coordinator-log record codec."""
from __future__ import annotations

import math
import struct
import time
from enum import IntEnum
from typing import Any

from ..protocol.errors import KafkaError
from ..clock import wall_ms


class TxnState(IntEnum):
    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    # Kafka's PrepareEpochFence (7) has no member: Kafka holds it only as the pending
    # state of an InitProducerId that fences an ongoing transaction, never as a state
    # logged or listed. Here that fence is one logged step, Ongoing -> PrepareAbort
    # under a bumped epoch, which needs no pending stage: nothing awaits between the
    # decision and the append.


def now_ms() -> int:
    return wall_ms()


S = TxnState
# target state -> states it may be entered from (Kafka's TransactionState rules).
VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
}
# The state of a transactional id the coordinator has no record of yet.
FIRST = S.EMPTY

PREPARED = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT})
COMPLETED = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})
COMPLETE_OF = {S.PREPARE_COMMIT: S.COMPLETE_COMMIT, S.PREPARE_ABORT: S.COMPLETE_ABORT}


def can_transition(src: TxnState | None, dst: TxnState) -> bool:
    """May a transactional id in `src` (None: not known yet) move to `dst`?"""
    return dst == FIRST if src is None else src in VALID_PREVIOUS[dst]


# EndTxn, decided by the state it finds once the producer id/epoch matched and no
# transition is pending: (state, commit?) -> the Prepare state to log, or the answer
# to give at once. A retry of a decision already carried out at this epoch is NONE
# (the Spark sink re-sends commits); the opposite decision is INVALID_TXN_STATE.
END_TXN: dict[tuple[TxnState, bool], TxnState | KafkaError] = {
    (S.ONGOING, True): S.PREPARE_COMMIT,
    (S.ONGOING, False): S.PREPARE_ABORT,
    (S.PREPARE_COMMIT, True): KafkaError.CONCURRENT_TRANSACTIONS,
    (S.PREPARE_COMMIT, False): KafkaError.CONCURRENT_TRANSACTIONS,
    (S.PREPARE_ABORT, True): KafkaError.CONCURRENT_TRANSACTIONS,
    (S.PREPARE_ABORT, False): KafkaError.CONCURRENT_TRANSACTIONS,
    (S.COMPLETE_COMMIT, True): KafkaError.NONE,
    (S.COMPLETE_COMMIT, False): KafkaError.INVALID_TXN_STATE,
    (S.COMPLETE_ABORT, True): KafkaError.INVALID_TXN_STATE,
    (S.COMPLETE_ABORT, False): KafkaError.NONE,
}


def end_txn_outcome(state: TxnState, commit: bool) -> TxnState | KafkaError:
    """What EndTxn does from `state` (states not in the table: INVALID_TXN_STATE)."""
    return END_TXN.get((state, commit), KafkaError.INVALID_TXN_STATE)


class TxnMeta:
    """One transactional id. Kept small: 100k idle ids must fit in ~50 MB."""
    __slots__ = ("txn_id", "producer_id", "epoch", "last_producer_id", "last_epoch", "timeout_ms",
                 "state", "partitions", "start_ms", "update_ms", "_pending", "pending_since", "deadline")
    _LOGGED = __slots__[:-3]   # what a state record holds and copy() carries

    def __init__(self, txn_id: str, producer_id: int, epoch: int, last_producer_id: int, last_epoch: int,
                 timeout_ms: int, state: TxnState, partitions: frozenset[tuple[str, int]] | None, start_ms: int,
                 update_ms: int) -> None:
        self.txn_id = txn_id
        self.producer_id = producer_id
        self.epoch = epoch
        self.last_producer_id = last_producer_id
        self.last_epoch = last_epoch
        self.timeout_ms = timeout_ms
        self.state = state
        self.partitions = partitions  # None when empty
        self.start_ms = start_ms
        self.update_ms = update_ms
        self._pending: TxnState | None = None
        # time.monotonic() when the current pending transition began: how long it has
        # been completing (update_ms is the last completed change, which after a
        # coordinator failover can be long before the transition now under way).
        self.pending_since = 0.0
        # time.monotonic() past which an ONGOING transaction times out (set when it is
        # replayed: txn_shard.TxnShard.replay); start_ms, the wall clock's, is only shown.
        self.deadline = math.inf

    @property
    def pending(self) -> TxnState | None:
        """Target state of the transition being logged or completed, None when idle.
        Always compared with None: the target of an InitProducerId bump is EMPTY == 0,
        and a falsy pending once let two instances of one id be initialised together."""
        return self._pending

    @pending.setter
    def pending(self, target: TxnState | None) -> None:
        if target is not None and target != self._pending:
            self.pending_since = time.monotonic()
        self._pending = target

    def copy(self, **changes: Any) -> "TxnMeta":
        fields = {k: getattr(self, k) for k in self._LOGGED}
        fields.update(changes)
        return TxnMeta(**fields)

    def parts(self) -> frozenset[tuple[str, int]]:
        return self.partitions or frozenset()


# --- log codec: key = transactional id; value = versioned binary record ---------

_VALUE = struct.Struct(">hqhqhiBqqi")
_VERSION = 0


def encode_value(m: TxnMeta) -> bytes:
    parts = sorted(m.parts())
    out = bytearray(_VALUE.pack(_VERSION, m.producer_id, m.epoch, m.last_producer_id, m.last_epoch,
                                m.timeout_ms, int(m.state), m.start_ms, m.update_ms, len(parts)))
    for topic, partition in parts:
        raw = topic.encode()
        out += struct.pack(">h", len(raw)) + raw + struct.pack(">i", partition)
    return bytes(out)


def decode_value(txn_id: str, raw: bytes) -> TxnMeta:
    (version, pid, epoch, last_pid, last_epoch, timeout_ms, state, start_ms, update_ms,
     n) = _VALUE.unpack_from(raw, 0)
    if version != _VERSION:
        raise ValueError(f"unknown transaction record version {version}")
    pos = _VALUE.size
    parts = []
    for _ in range(n):
        (tlen,) = struct.unpack_from(">h", raw, pos)
        topic = raw[pos + 2:pos + 2 + tlen].decode()
        (partition,) = struct.unpack_from(">i", raw, pos + 2 + tlen)
        parts.append((topic, partition))
        pos += 2 + tlen + 4
    return TxnMeta(txn_id, pid, epoch, last_pid, last_epoch, timeout_ms, TxnState(state),
                   frozenset(parts) or None, start_ms, update_ms)
