"""Opening a partition log: finding its segments and recovering what a crash left.

open() trusts what the recovery-point checkpoint says is on disk and checks only the
bytes after it (structure, offset continuity, CRC-32C), cutting the log at the first
torn or corrupt batch; then it rebuilds producer state and the aborted-transaction
index of the recovered tail from the newest producer snapshot. A clean close leaves
nothing to check. A LogLoader owns one opening: it is given the files (FileSystem,
directory, settings), keeps what it did in its RecoveryInfo and hands PartitionLog the
recovered segments and producer state (LoadedLog); a follower's truncation rebuilds
producer state with replay_producers.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from semel.protocol.records import CONTROL_ABORT, BatchHeader, iter_records

from . import checkpoint as cpfile
from .fs import FileSystem
from .log_config import LogConfig
from .producer_state import ProducerStateManager, load_latest_snapshot, prune_snapshots
from .segment import INDEX_SUFFIXES, LOG_SUFFIX, Segment, parse_segment_file, scan_valid
from .txn_index import AbortedTxn
from .types import AppendInfo

log = logging.getLogger("semel.storage")


@dataclass
class RecoveryInfo:
    """What open() had to do; tests and benchmarks read it."""
    used_checkpoint: bool = False
    clean: bool = False
    scanned_bytes: int = 0            # bytes whose batches were walked
    crc_checked_bytes: int = 0        # of which CRC-checked (after the recovery point)
    truncated_bytes: int = 0          # torn/corrupt tail removed
    segments_removed: list[int] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class LoadedLog:
    """What an opening recovered: the segments (the last one active), where the log
    starts, the producer state at its end, and whether a recovery checkpoint must
    now vouch for a tail that was checked (not clean)."""
    segments: list[Segment]
    log_start_offset: int
    producers: ProducerStateManager
    clean: bool

    @property
    def log_end_offset(self) -> int:
        return self.segments[-1].next_offset


class LogLoader:
    """One opening of a partition log's directory (PartitionLog.open): load() finds the
    segments, checks and cuts what the checkpoint does not vouch for, and replays
    producer state; `recovery` says what it had to do."""

    def __init__(self, fs: FileSystem, directory: Path, config: LogConfig) -> None:
        self.fs = fs
        self.directory = directory
        self.config = config
        self.recovery = RecoveryInfo()

    def load(self) -> LoadedLog:
        """The recovered log, its recovered tail fsynced (the caller then writes the
        checkpoint that records it, unless the log was clean)."""
        fs, d = self.fs, self.directory
        fs.makedirs(d)
        names = fs.listdir(d)
        bases = sorted(b for n in names if (b := parse_segment_file(n, LOG_SUFFIX)) is not None)
        self._remove_debris(names, set(bases))
        cp = self._read_checkpoint()
        if not bases:
            return self._create_first_segment(cp.log_start_offset if cp else 0)
        segs = [Segment(fs, d, b) for b in bases]
        rec_i, rec_pos, rec_off, from_cp = self._recovery_start(cp, segs)
        r = self.recovery
        r.used_checkpoint = from_cp
        kept = self._scan_segments(segs, rec_i, rec_pos, rec_off, cp if from_cp else None)
        leo = kept[-1].next_offset
        start = cp.log_start_offset if cp else 0
        r.clean = bool(from_cp and cp is not None and cp.clean and r.crc_checked_bytes == 0
                       and r.truncated_bytes == 0 and cp.recovery_offset == leo)
        producers = replay_producers(fs, d, kept, rec_off if from_cp else kept[0].base)
        if not r.clean:
            self._sync_recovered(kept[min(rec_i, len(kept) - 1):], kept[-1])
        for seg in kept[:-1]:
            seg.close()  # reopened on first read; keeps descriptors few
        return LoadedLog(kept, min(max(start, kept[0].base), leo), producers, r.clean)

    def _remove_debris(self, names: list[str], bases: set[int]) -> None:
        """Temp files of interrupted atomic writes, and index files whose log is gone
        (a segment deletion that crashed midway)."""
        for n in names:
            if n.endswith(".tmp") or n.endswith(".deleted"):
                self.fs.unlink(self.directory / n)
                continue
            for suffix in INDEX_SUFFIXES:
                b = parse_segment_file(n, suffix)
                if b is not None and b not in bases:
                    self.fs.unlink(self.directory / n)

    def _read_checkpoint(self) -> cpfile.Checkpoint | None:
        path = self.directory / cpfile.FILE_NAME
        try:
            data = self.fs.read_file(path)
        except FileNotFoundError:
            return None
        cp = cpfile.decode(data)
        if cp is None:
            log.warning("%s: recovery checkpoint is damaged; checking the whole log", self.directory)
        return cp

    def _create_first_segment(self, base: int) -> LoadedLog:
        seg = Segment(self.fs, self.directory, base)
        seg.create_files()
        self.fs.fsync_dir(self.directory)
        self.recovery.clean = True
        return LoadedLog([seg], base, ProducerStateManager(), clean=True)

    def _recovery_start(self, cp: cpfile.Checkpoint | None, segs: list[Segment]
                        ) -> tuple[int, int, int, bool]:
        """(segment index, byte position, offset, from checkpoint?) where CRC checks start."""
        if cp is not None:
            for i, seg in enumerate(segs):
                if seg.base == cp.segment_base:
                    if cp.position <= self.fs.file_size(seg.path(LOG_SUFFIX)):
                        return i, cp.position, cp.recovery_offset, True
                    break
            log.warning("%s: checkpoint does not match the segments; checking the whole log", self.directory)
        return 0, 0, segs[0].base, False

    def _scan_segments(self, segs: list[Segment], rec_i: int, rec_pos: int, rec_off: int,
                       cp: cpfile.Checkpoint | None) -> list[Segment]:
        """Walk each segment from its last trusted index entry; CRC-check from the recovery
        point on; cut the log at the first bad batch. Returns the segments kept."""
        interval = self.config.index_interval_bytes
        for i, seg in enumerate(segs):
            seg.size = self.fs.size(seg.log)
            if i < rec_i:
                seg.load_indexes(limit_pos=seg.size, limit_offset=2**63 - 1)
                crc_from = seg.size
            elif i == rec_i:
                seg.load_indexes(limit_pos=rec_pos, limit_offset=rec_off)
                if cp is not None and cp.segment_base == seg.base and cp.max_timestamp > seg.max_ts:
                    seg.max_ts, seg.max_ts_offset = cp.max_timestamp, cp.max_timestamp_offset
                crc_from = rec_pos
            else:
                seg.reset_indexes()
                crc_from = 0
            if i > 0 and seg.base != segs[i - 1].next_offset:
                log.warning("%s: segment %d does not continue offset %d; dropping it and later ones",
                            self.directory, seg.base, segs[i - 1].next_offset)
                return self._drop_from(segs, i)
            valid_end, file_end = self._scan_one(seg, crc_from, interval)
            if valid_end < file_end:
                log.warning("%s: cutting torn/corrupt tail of segment %d at byte %d (%d bytes)",
                            self.directory, seg.base, valid_end, file_end - valid_end)
                self.fs.truncate(seg.log, valid_end)
                self.fs.fsync(seg.log)
                self.recovery.truncated_bytes += file_end - valid_end
                return self._drop_from(segs, i + 1)
        return segs

    def _scan_one(self, seg: Segment, crc_from: int, interval: int) -> tuple[int, int]:
        start = seg.idx_pos[-1] if seg.idx_pos else 0
        seg.size = start
        seg.next_offset = seg.base + seg.idx_rel[-1] if seg.idx_pos else seg.base
        file_end = self.fs.size(seg.log)
        if file_end <= start:
            return start, file_end
        mm = self.fs.map_readonly(seg.log, file_end)
        try:
            for pos, hdr in scan_valid(mm, start, file_end, seg.next_offset, crc_from):
                seg.note_batch(pos, hdr.base_offset, hdr, interval)
        finally:
            mm.close()
        self.recovery.scanned_bytes += seg.size - start
        self.recovery.crc_checked_bytes += max(0, seg.size - max(crc_from, start))
        return seg.size, file_end

    def _drop_from(self, segs: list[Segment], i: int) -> list[Segment]:
        for seg in segs[i:]:
            self.recovery.segments_removed.append(seg.base)
            self.recovery.truncated_bytes += self.fs.file_size(seg.path(LOG_SUFFIX))
            seg.delete_files()
        return segs[:i]

    def _sync_recovered(self, segs: list[Segment], active: Segment) -> None:
        """Make the recovered tail durable (PartitionLog.open then checkpoints it, so the
        next open starts from here)."""
        for seg in segs:
            self.fs.fsync(seg.log)
            if seg is not active:
                seg.seal_time_index()
            seg.persist_indexes(sync=seg is not active)
        self.fs.fsync_dir(self.directory)


def replay_producers(fs: FileSystem, directory: Path, segments: list[Segment], recovery_offset: int
                     ) -> ProducerStateManager:
    """Rebuild producer state and the aborted-txn index of a recovered tail.

    Start from the newest snapshot at or below the recovery point and replay batch
    headers from there to the end (control batches: their one record gives the
    marker type). Aborts at or after the recovery point get their index entries
    again; earlier ones were made durable before that checkpoint was written.
    """
    leo = segments[-1].next_offset
    prune_snapshots(fs, directory, keep=1 << 30, above=leo)   # past a cut tail
    first_base = segments[0].base
    found = load_latest_snapshot(fs, directory, min(recovery_offset, leo))
    if found is not None:
        start, producers = found
    else:
        start, producers = first_base, ProducerStateManager()
    # With no snapshot reaching back to the data, transactions may have begun in
    # deleted segments: an abort from a producer never seen is indexed from here.
    cold = start < first_base or (found is None and first_base > 0)
    start = max(start, first_base)
    for seg in segments:
        if seg.next_offset <= start:
            continue
        for pos, hdr in seg.iter_headers(seg.lookup(start) if start > seg.base else 0):
            if hdr.last_offset < start:
                continue
            if hdr.is_control:
                _replay_marker(fs, producers, seg, pos, hdr, recovery_offset, start if cold else None)
            elif hdr.producer_id >= 0:
                producers.update(hdr, AppendInfo(hdr.base_offset, hdr.last_offset))
    for seg in segments:
        seg.txn.truncate_to(leo)
    return producers


def _replay_marker(fs: FileSystem, producers: ProducerStateManager, seg: Segment, pos: int, hdr: BatchHeader,
                   recovery_offset: int, cold_start: int | None) -> None:
    kind, coordinator_epoch = read_marker(fs.pread(seg.log, hdr.size, pos))
    if kind is None:
        log.warning("%s: control batch at %d has no readable marker; ignored", seg.path(LOG_SUFFIX),
                    hdr.base_offset)
        return
    known = producers.entry(hdr.producer_id) is not None
    first = producers.complete_txn(hdr.producer_id, hdr.producer_epoch, coordinator_epoch, hdr.max_timestamp)
    if kind != CONTROL_ABORT or hdr.base_offset < recovery_offset:
        return
    if first is None and cold_start is not None and not known and cold_start < hdr.base_offset:
        first = cold_start
    if first is not None:
        index_abort(producers, seg, hdr.producer_id, first, hdr.base_offset)


def index_abort(producers: ProducerStateManager, seg: Segment, producer_id: int, first: int, marker: int) -> None:
    """Record in seg's aborted-transaction index that producer_id's transaction from
    `first` was aborted by the marker at `marker` (producers: the state after it)."""
    lso = producers.first_unstable_offset()
    seg.txn.append(AbortedTxn(producer_id, first, marker, marker + 1 if lso is None else lso))


def read_marker(batch: bytes) -> tuple[int | None, int]:
    """(kind, coordinator epoch) of a control batch; (None, -1) when unreadable."""
    try:
        rec = next(iter_records(batch), None)
    except ValueError:
        return None, -1
    if rec is None or rec.key is None or len(rec.key) < 4:
        return None, -1
    kind = int.from_bytes(rec.key[2:4], "big", signed=True)
    epoch = int.from_bytes(rec.value[2:6], "big", signed=True) if rec.value and len(rec.value) >= 6 else -1
    return kind, epoch

