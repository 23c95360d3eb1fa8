"""Per-partition producer state: what makes retries idempotent and transactions visible.

For each producer id the partition remembers its epoch, the metadata of its last
5 batches (first/last sequence, first/last offset), the last timestamp, the
coordinator epoch of its last marker and the first offset of its open
transaction. From that:

- a retry of one of the last 5 batches is recognised and answered with the
  original offsets (nothing is written twice);
- a gap or reordering of sequences, or an older epoch, is refused;
- the earliest open transaction gives the last stable offset (LSO).

`check*` methods never change anything; `update` / `complete_txn` are called only
after the log write succeeded, so a failed write leaves the state as it was.

The state is saved in `<offset:020d>.snapshot` files (state after every batch
below offset; CRC-protected) and rebuilt at open by replaying batch headers from
the newest usable snapshot.
"""
from __future__ import annotations

import struct
from pathlib import Path

from semel.protocol.errors import KafkaError
from semel.protocol.records import NO_SEQUENCE, BatchHeader

from . import checked_file
from .fs import FileSystem
from .types import AppendInfo

BATCHES_KEPT = 5
_SEQ_MASK = 0x7FFFFFFF
OK = KafkaError.NONE


# First/last offset of a batch entry that only anchors the sequence (see seal_transaction).
SEQUENCE_ANCHOR = -1


def next_sequence(last_seq: int) -> int:
    """Sequence that must follow last_seq (int32 sequences wrap to 0)."""
    return (last_seq + 1) & _SEQ_MASK


class ProducerEntry:
    """State of one producer in one partition. Kept small: slots and tuples only."""

    __slots__ = ("producer_id", "epoch", "batches", "last_timestamp", "coordinator_epoch", "txn_first_offset")

    def __init__(self, producer_id: int, epoch: int, batches: list[tuple[int, int, int, int]] | None = None, last_timestamp: int = -1,
                 coordinator_epoch: int = -1, txn_first_offset: int | None = None):
        self.producer_id = producer_id
        self.epoch = epoch
        # (first_seq, last_seq, first_offset, last_offset), oldest first, at most BATCHES_KEPT
        self.batches: list[tuple[int, int, int, int]] = batches if batches is not None else []
        self.last_timestamp = last_timestamp
        self.coordinator_epoch = coordinator_epoch
        self.txn_first_offset = txn_first_offset

    @property
    def last_seq(self) -> int:
        return self.batches[-1][1] if self.batches else NO_SEQUENCE

    def find_duplicate(self, first_seq: int, last_seq: int) -> tuple[int, int] | None:
        for f, l, fo, lo in self.batches:
            if f == first_seq and l == last_seq and fo != SEQUENCE_ANCHOR:
                return fo, lo
        return None

    def seal_transaction(self) -> None:
        """A transaction marker ends the dedup window of the batches before it.

        No legitimate retry can follow a marker: a client sends EndTxn only after
        every batch of the transaction was acknowledged, and coordinator aborts
        bump the epoch. A batch that repeats a sequence from before the marker is
        a client that lost track of what it sent (e.g. purged a batch the broker
        had in fact written): answering "duplicate" would tell it a new record was
        stored when it was not. Keep only the last sequence as an anchor, so the
        repeat is OUT_OF_ORDER_SEQUENCE_NUMBER and the client aborts and bumps.
        """
        if self.batches:
            f, l, _, _ = self.batches[-1]
            self.batches = [(f, l, SEQUENCE_ANCHOR, SEQUENCE_ANCHOR)]

    def __repr__(self) -> str:
        return (f"ProducerEntry(pid={self.producer_id}, epoch={self.epoch}, batches={self.batches}, "
                f"txn_first={self.txn_first_offset})")


class ProducerStateManager:
    def __init__(self) -> None:
        self._entries: dict[int, ProducerEntry] = {}
        self._ongoing: dict[int, int] = {}      # producer id -> first offset of its open transaction

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self._entries.get(producer_id)

    def producer_ids(self) -> list[int]:
        """Every producer id this partition remembers (for DescribeProducers and metrics)."""
        return list(self._entries)

    # -- validation (pure) --------------------------------------------------------------
    def check(self, hdr: BatchHeader) -> tuple[KafkaError, AppendInfo | None]:
        """(error, duplicate info) for one data batch against the current state."""
        pid = hdr.producer_id
        if pid < 0:
            return OK, None                                  # not an idempotent producer
        seq = hdr.base_sequence
        e = self._entries.get(pid)
        if e is None:
            if seq in (0, NO_SEQUENCE):
                return OK, None
            return KafkaError.UNKNOWN_PRODUCER_ID, None      # state lost or expired: client must reset
        if hdr.producer_epoch < e.epoch:
            return KafkaError.INVALID_PRODUCER_EPOCH, None   # fenced by a newer instance
        if not hdr.is_transactional and e.txn_first_offset is not None:
            return KafkaError.INVALID_TXN_STATE, None        # plain write inside an open transaction
        if seq == NO_SEQUENCE:
            return OK, None                                  # coordinator's own batches: epoch check only
        if hdr.producer_epoch > e.epoch:
            return (OK, None) if seq == 0 else (KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, None)
        dup = e.find_duplicate(seq, hdr.last_sequence)
        if dup is not None:
            return OK, AppendInfo(dup[0], dup[1], -1, duplicate=True)
        expected = 0 if not e.batches else next_sequence(e.last_seq)
        if seq != expected:
            return KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, None
        return OK, None

    def check_batches(self, hdrs: list[BatchHeader]) -> tuple[KafkaError, AppendInfo | None]:
        """Validate the batches of one produce request together.

        A later batch of the same producer in the same request must continue the
        earlier one. When every idempotent batch is a duplicate, the request is a
        retry: the original offsets come back and nothing is written. A request that
        mixes duplicates with new batches is refused rather than half-applied.
        """
        last_in_request: dict[int, tuple[int, int, bool]] = {}   # pid -> (epoch, last seq, was dup)
        dups: list[AppendInfo] = []
        fresh = 0
        for hdr in hdrs:
            pid = hdr.producer_id
            prev = last_in_request.get(pid) if pid >= 0 else None
            if prev is not None and not prev[2]:
                epoch, last_seq, _ = prev
                if hdr.producer_epoch != epoch or (hdr.base_sequence != NO_SEQUENCE
                                                   and hdr.base_sequence != next_sequence(last_seq)):
                    return KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, None
                dup = None
            else:
                err, dup = self.check(hdr)
                if err is not OK:
                    return err, None
            if dup is not None:
                dups.append(dup)
            else:
                fresh += 1
            if pid >= 0:
                last_in_request[pid] = (hdr.producer_epoch, hdr.last_sequence, dup is not None)
        if dups and fresh:
            return KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, None
        if dups:
            return OK, AppendInfo(min(d.first_offset for d in dups), max(d.last_offset for d in dups), -1, True)
        return OK, None

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> KafkaError:
        e = self._entries.get(producer_id)
        if e is None:
            return OK
        if producer_epoch < e.epoch:
            return KafkaError.INVALID_PRODUCER_EPOCH
        if coordinator_epoch < e.coordinator_epoch:
            return KafkaError.TRANSACTION_COORDINATOR_FENCED   # a deposed coordinator
        return OK

    # -- changes (after a successful write, or during replay) --------------------------
    def update(self, hdr: BatchHeader, info: AppendInfo) -> None:
        """Record a data batch written at info.first_offset..info.last_offset."""
        pid = hdr.producer_id
        if pid < 0:
            return
        e = self._entries.get(pid)
        if e is None:
            e = self._entries[pid] = ProducerEntry(pid, hdr.producer_epoch)
        elif hdr.producer_epoch > e.epoch:
            e.epoch = hdr.producer_epoch
            e.batches = []           # sequences restart with a new epoch
        if hdr.base_sequence != NO_SEQUENCE:
            e.batches.append((hdr.base_sequence, hdr.last_sequence, info.first_offset, info.last_offset))
            if len(e.batches) > BATCHES_KEPT:
                del e.batches[0]
        if hdr.max_timestamp > e.last_timestamp:
            e.last_timestamp = hdr.max_timestamp
        if hdr.is_transactional and e.txn_first_offset is None:
            e.txn_first_offset = info.first_offset
            self._ongoing[pid] = info.first_offset

    def complete_txn(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                     timestamp: int) -> int | None:
        """Apply a COMMIT/ABORT marker; returns the first offset of the transaction it
        ended (None if the producer had none open in this partition)."""
        e = self._entries.get(producer_id)
        if e is None:
            e = self._entries[producer_id] = ProducerEntry(producer_id, producer_epoch)
        elif producer_epoch > e.epoch:
            e.epoch = producer_epoch   # a marker may carry a bumped epoch (abort on re-init)
            e.batches = []
        e.coordinator_epoch = max(e.coordinator_epoch, coordinator_epoch)
        e.seal_transaction()
        if timestamp > e.last_timestamp:
            e.last_timestamp = timestamp
        first, e.txn_first_offset = e.txn_first_offset, None
        self._ongoing.pop(producer_id, None)
        return first

    def expire(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers idle for expiration_ms (never one with an open transaction)."""
        idle = [pid for pid, e in self._entries.items()
                if e.txn_first_offset is None and now_ms - e.last_timestamp >= expiration_ms]
        for pid in idle:
            del self._entries[pid]
        return len(idle)

    # -- queries -------------------------------------------------------------------------
    def ongoing_first_offsets(self) -> dict[int, int]:
        """producer id -> first offset of its open transaction."""
        return dict(self._ongoing)

    def first_unstable_offset(self) -> int | None:
        return min(self._ongoing.values()) if self._ongoing else None

    # -- snapshots --------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        parts = [_HEAD.pack(_MAGIC, _VERSION, len(self._entries))]
        for e in self._entries.values():
            txn = -1 if e.txn_first_offset is None else e.txn_first_offset
            parts.append(_ENTRY.pack(e.producer_id, e.epoch, e.last_timestamp, e.coordinator_epoch, txn,
                                     len(e.batches)))
            parts.extend(_BATCH.pack(*b) for b in e.batches)
        body = b"".join(parts)
        return checked_file.seal(body)

    @classmethod
    def from_bytes(cls, data: bytes) -> "ProducerStateManager":
        """Raises ValueError when data is not an intact snapshot."""
        if len(data) < _HEAD.size + 4:
            raise ValueError("snapshot too short")
        body = checked_file.unseal(data)
        if body is None:
            raise ValueError("snapshot checksum mismatch")
        magic, version, count = _HEAD.unpack_from(body, 0)
        if magic != _MAGIC or version != _VERSION:
            raise ValueError("not a producer-state snapshot")
        state, pos = cls(), _HEAD.size
        try:
            for _ in range(count):
                pid, epoch, ts, coord, txn, nb = _ENTRY.unpack_from(body, pos)
                pos += _ENTRY.size
                batches = [_BATCH.unpack_from(body, pos + i * _BATCH.size) for i in range(nb)]
                pos += nb * _BATCH.size
                e = ProducerEntry(pid, epoch, batches, ts, coord, None if txn < 0 else txn)
                state._entries[pid] = e
                if e.txn_first_offset is not None:
                    state._ongoing[pid] = e.txn_first_offset
        except struct.error as exc:
            raise ValueError(f"snapshot truncated: {exc}") from None
        if pos != len(body):
            raise ValueError("snapshot has trailing bytes")
        return state


_MAGIC = b"SMPS"
_VERSION = 1
_HEAD = struct.Struct(">4sBI")
_ENTRY = struct.Struct(">qhqiqB")     # pid, epoch, last timestamp, coordinator epoch, txn first, n batches
_BATCH = struct.Struct(">iiqq")       # first seq, last seq, first offset, last offset

SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOTS_KEPT = 2


def snapshot_path(directory: Path, offset: int) -> Path:
    return Path(directory) / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def list_snapshots(fs: FileSystem, directory: Path) -> list[int]:
    out = []
    for name in fs.listdir(directory):
        stem = name[:-len(SNAPSHOT_SUFFIX)]
        if name.endswith(SNAPSHOT_SUFFIX) and len(stem) == 20 and stem.isdigit():
            out.append(int(stem))
    return sorted(out)


def write_snapshot(fs: FileSystem, directory: Path, offset: int, data: bytes) -> None:
    """Atomic; the caller fsyncs the directory (it does so for the checkpoint anyway)."""
    fs.write_atomic(snapshot_path(directory, offset), data, sync_dir=False)


def load_latest_snapshot(fs: FileSystem, directory: Path, upto: int
                         ) -> tuple[int, ProducerStateManager] | None:
    """Newest intact snapshot at or below upto; damaged ones are skipped (and removed)."""
    for offset in reversed(list_snapshots(fs, directory)):
        if offset > upto:
            continue
        try:
            return offset, ProducerStateManager.from_bytes(fs.read_file(snapshot_path(directory, offset)))
        except (ValueError, OSError):
            fs.unlink(snapshot_path(directory, offset))
    return None


def prune_snapshots(fs: FileSystem, directory: Path, *, keep: int = SNAPSHOTS_KEPT, above: int | None = None) -> None:
    """Keep the newest `keep` snapshots; with above, first drop every one past that offset."""
    offsets = list_snapshots(fs, directory)
    if above is not None:
        for off in [o for o in offsets if o > above]:
            fs.unlink(snapshot_path(directory, off))
        offsets = [o for o in offsets if o <= above]
    for off in offsets[:-keep] if keep else offsets:
        fs.unlink(snapshot_path(directory, off))
