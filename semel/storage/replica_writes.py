"""What a follower's replica of a partition log does that a leader's never does.

It appends the leader's batches exactly as fetched (offsets, epochs, producer ids
kept), cuts its log back to where it agrees with the leader (truncate_to), or starts
over past the leader's log start (reset_to). Producer state, the aborted-transaction
index and the leader-epoch cache follow the data, so the replica can take over.
ReplicaWrites is one of PartitionLog's parts (storage/log.py holds the state it works
on, and the role it is given: set_follower, set_leader_epoch, set_high_watermark).
"""
from __future__ import annotations

from bisect import bisect_right

from semel.protocol.errors import KafkaError
from semel.protocol.records import CONTROL_ABORT, BatchHeader, split_batches

from .errors import AppendError, StorageError
from .log_loader import read_marker
from .producer_state import ProducerStateManager, prune_snapshots
from .segment import Segment
from .types import AppendInfo


class ReplicaWrites:
    """PartitionLog's follower-side writes."""

    def append_replicated(self, data: bytes | bytearray | memoryview) -> AppendInfo:
        """Follower: append batches fetched from the leader exactly as given (offsets,
        leader epochs, producer ids and sequences kept; control batches included).

        Producer state, the aborted-transaction index and the leader-epoch cache are
        built as on the leader, so this replica can take over: deduplicate a retry,
        keep the LSO and answer read_committed fetches. The first batch must start at
        the log end and offsets must be contiguous (AppendError otherwise).
        """
        batches = self._admit_replicated(data)
        return self._write(data, batches, on_success=lambda placed: self._apply_replicated(data, placed),
                           assign=False)

    def append_replicated_begin(self, data: bytes | bytearray | memoryview):
        """append_replicated with its pwrite in a worker thread (a large fetch: the
        follower's event loop stays free). Everything up to the pwrite happens in this
        call, before it returns, so a caller that checked its role just before knows
        the write belongs to that role. Returns an awaitable of the AppendInfo.

        The log end, producer state and indexes move only when the write has finished
        (as append_async), so the log end a follower reports in its next fetch counts
        only written bytes; a truncation, reset, close or role change meanwhile first
        waits for the write and applies it (_settle_pending), so no write lands past a
        truncation point. Raises AppendError / StorageError like append_replicated."""
        batches = self._admit_replicated(data)      # settles an earlier pending write first
        w = self._prepare_write(data, batches, lambda placed: self._apply_replicated(data, placed), assign=False)
        self._submit_write(w)
        return self._write_in_thread(w)

    def _admit_replicated(self, data) -> list[tuple[int, BatchHeader]]:
        """append_replicated's checks, and the leader epochs of its batches recorded."""
        self._check_writable()
        batches, err = split_batches(data)
        if err is not KafkaError.NONE:
            raise AppendError(err, f"replicated batches for {self.directory} do not parse: {err.name}")
        first = batches[0][1]
        if first.base_offset < self.log_end_offset <= first.last_offset and self.size_bytes() == 0:
            self._rebase_empty(first.base_offset)    # after reset_to: the leader's first batch straddles its start
        expect = self.log_end_offset
        for _, hdr in batches:
            if hdr.base_offset != expect:
                raise AppendError(KafkaError.OFFSET_OUT_OF_RANGE,
                                  f"{self.directory}: replicated batch at {hdr.base_offset}, log end {expect}")
            expect = hdr.next_offset
        try:
            for _, hdr in batches:   # before the data: a cache entry past the log end is cut at open
                self.epochs.assign(hdr.leader_epoch, hdr.base_offset)
        except OSError as exc:
            raise StorageError(f"{self.directory}: cannot write the leader-epoch cache: {exc}") from exc
        return batches

    def reset_to(self, offset: int) -> None:
        """Follower: the leader's log now starts past this replica's end (retention or
        DeleteRecords while it was away), so nothing here can be continued: drop every
        record and start empty at `offset`. Producer state and epochs go too (the
        leader's batches from `offset` on rebuild what is still relevant)."""
        self._settle_pending()   # first: a roll in a worker thread waits for _io_lock
        with self._io_lock:
            self._check_writable()
            if offset <= self.log_end_offset:
                raise ValueError(f"reset_to({offset}) on a log ending at {self.log_end_offset}")
            new = Segment(self.fs, self.directory, offset)
            try:
                # New segment first: a crash before the old ones are gone leaves a gap that
                # the next open cuts at, which drops the new segment, not the old data.
                new.create_files()
                self.fs.fsync_dir(self.directory)
                with self._lock:
                    doomed = self._segments
                    self._install([new])
                    self.log_start_offset = self.flushed_offset = offset
                    self.producers = ProducerStateManager()
                for seg in doomed:
                    seg.delete_files()
                prune_snapshots(self.fs, self.directory, keep=0)
                self.epochs.truncate_from_end(0)
                self._flush_locked(force_checkpoint=True, strict=True)
            except OSError as exc:
                self._failed = f"reset to {offset} failed: {exc}"
                raise StorageError(f"{self.directory}: {self._failed}") from exc
            if self._replicated_hw is not None:
                self._replicated_hw = offset

    def _rebase_empty(self, base: int) -> None:
        """An empty log (just reset) starts its segment at `base` instead, below its log
        start, so the leader's batch holding the log start can be stored whole; reads
        below the log start stay refused, as on the leader."""
        self._settle_pending()   # first: a roll in a worker thread waits for _io_lock
        with self._io_lock:
            new = Segment(self.fs, self.directory, base)
            try:
                new.create_files()
                with self._lock:
                    old = self._segments
                    self._install([new])
                for seg in old:
                    seg.delete_files()
                self.fs.fsync_dir(self.directory)
            except OSError as exc:
                raise StorageError(f"{self.directory}: cannot start the log at {base}: {exc}") from exc

    def _apply_replicated(self, data, placed) -> None:
        for pos, base, hdr in placed:
            if not hdr.is_control:
                self.producers.update(hdr, AppendInfo(base, base + hdr.last_offset_delta))
                continue
            kind, coordinator_epoch = read_marker(bytes(data[pos:pos + hdr.size]))
            first = self.producers.complete_txn(hdr.producer_id, hdr.producer_epoch, coordinator_epoch,
                                                hdr.max_timestamp)
            if kind == CONTROL_ABORT and first is not None:
                self._index_abort(self._segments[-1], hdr.producer_id, first, base)

    def truncate_to(self, offset: int) -> int:
        """Follower: cut the log back to `offset` (KIP-101 truncation) and return the new
        log end (the start of the batch holding `offset`, as replicas share batch
        boundaries). Producer state, the aborted-transaction index and the leader-epoch
        cache go back with it. Crash-safe: a crash midway leaves a checkpoint that no
        longer matches the segments, so the next open checks the whole log."""
        self._settle_pending()   # first: a roll in a worker thread waits for _io_lock
        with self._io_lock:
            self._check_writable()
            if offset >= self.log_end_offset:
                # No record to cut, but an epoch may begin right at the log end (a leader
                # that wrote nothing in it): it is history the new leader does not share.
                try:
                    self.epochs.truncate_from_end(offset)
                except OSError as exc:
                    raise StorageError(f"{self.directory}: cannot write the leader-epoch cache: {exc}") from exc
                return self.log_end_offset
            offset = max(offset, self.log_start_offset)
            i = max(0, bisect_right(self._bases, offset) - 1)
            try:
                with self._lock:
                    doomed = self._segments[i + 1:]
                    del self._segments[i + 1:]
                    del self._bases[i + 1:]
                    seg = self._segments[i]
                    seg.truncate_to(offset)
                    self.log_end_offset = seg.next_offset
                    self.log_start_offset = min(self.log_start_offset, self.log_end_offset)
                    self.flushed_offset = min(self.flushed_offset, self.log_end_offset)
                for old in doomed:
                    old.delete_files()
                self.fs.fsync(seg.log)
                self.flushed_offset = self.log_end_offset
                self.epochs.truncate_from_end(self.log_end_offset)
                with self._lock:
                    self._after_recovery(self.log_end_offset)
                self._flush_locked(force_checkpoint=True, strict=True)
            except OSError as exc:
                self._failed = f"truncation to {offset} failed: {exc}"
                raise StorageError(f"{self.directory}: {self._failed}") from exc
            if self._replicated_hw is not None:
                self._replicated_hw = min(self._replicated_hw, self.log_end_offset)
            return self.log_end_offset
