"""Reading a partition log: batches by offset (verified or not), the offset of a
timestamp, and the aborted transactions a read_committed fetch is told of.

A LogReader works on one PartitionLog (semel.storage.log), given to it as a ReadLog:
the members below are all it reads. It owns the set of damaged batches already
reported, so each is logged once.
"""
from __future__ import annotations

import logging
from bisect import bisect_right
from pathlib import Path
from typing import Protocol

from semel.protocol.records import verified_prefix

from .errors import CorruptLogError, OffsetOutOfRange, StorageError
from .segment import LOG_SUFFIX, Segment, segment_name

log = logging.getLogger("semel.storage")


class ReadLog(Protocol):
    """What LogReader needs of its log (PartitionLog)."""
    directory: Path
    segments: list[Segment]
    bases: list[int]
    log_start_offset: int
    log_end_offset: int

    def check_readable(self) -> None: ...


class LogReader:
    """The reads of one log; `damage_reported` keeps the (file, offset) already logged."""

    def __init__(self, log: ReadLog) -> None:
        self._log = log
        self.damage_reported: set[tuple[str, int]] = set()

    def read(self, offset: int, max_bytes: int, upper_bound: int | None = None) -> bytes | memoryview:
        """Whole batches from the one holding offset: at least one if one lies wholly below
        upper_bound (even if bigger than max_bytes), never one whose last offset >= upper_bound."""
        plog = self._log
        plog.check_readable()
        start, leo = plog.log_start_offset, plog.log_end_offset
        if offset < start or offset > leo:
            raise OffsetOutOfRange(offset, start, leo)
        bound = leo if upper_bound is None else min(upper_bound, leo)
        if offset >= bound:
            return b""
        segs = plog.segments
        i = max(0, bisect_right(plog.bases, offset) - 1)
        try:
            while i < len(segs):
                out = segs[i].read(offset, max_bytes, bound)
                if out is not None:
                    return out
                i += 1
        except OSError as exc:
            raise StorageError(f"read of {plog.directory} failed: {exc}") from exc
        return b""

    def read_checked(self, offset: int, max_bytes: int, upper_bound: int | None = None,
                     crc: bool = True) -> bytes | memoryview:
        """read(), verified batch by batch (structure, offset order, CRC-32C): the good
        batches before any damage, or CorruptLogError naming the segment file when
        the first batch itself is damaged. Readers that hand bytes to clients or
        replay coordinator state use this, never the unverified read(). crc=False
        leaves the CRC-32C to a reader that checks every batch's itself (a follower)."""
        plog = self._log
        data = self.read(offset, max_bytes, upper_bound)
        good, bad_at = verified_prefix(data, offset, crc)
        if not data:
            # Offsets end on batch boundaries (high watermark, LSO, log end), so nothing
            # below the bound means the header there claims offsets it does not hold: a
            # reader would wait at this offset for ever, a replay would stop short.
            bound = plog.log_end_offset if upper_bound is None else min(upper_bound, plog.log_end_offset)
            bad_at = offset if plog.log_start_offset <= offset < bound else None
        if bad_at is None:
            return data
        path = self.segment_path(bad_at)
        first = (path, bad_at) not in self.damage_reported
        if first and len(self.damage_reported) < 1000:
            self.damage_reported.add((path, bad_at))
            log.error("%s: damaged batch at offset %d (CRC or structure); it is not served", path, bad_at)
        if good:
            return good
        raise CorruptLogError(f"{path}: damaged batch at offset {bad_at}", path, bad_at, first)

    def segment_path(self, offset: int) -> str:
        """The segment data file holding `offset` (for messages)."""
        bases = self._log.bases
        i = max(bisect_right(bases, offset) - 1, 0)
        return str(self._log.directory / f"{segment_name(bases[i] if bases else 0)}{LOG_SUFFIX}")

    def offset_for_timestamp(self, ts_ms: int) -> tuple[int, int] | None:
        """(timestamp, offset) of the first record with timestamp >= ts_ms, or None."""
        plog = self._log
        plog.check_readable()
        segs = plog.segments
        try:
            for k, seg in enumerate(segs):
                if k < len(segs) - 1 and seg.max_ts < ts_ms:
                    continue  # a sealed segment knows its max exactly
                hit = seg.find_timestamp(ts_ms, plog.log_start_offset)
                if hit is not None:
                    return hit
        except OSError as exc:
            raise StorageError(f"timestamp lookup in {plog.directory} failed: {exc}") from exc
        return None

    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[tuple[int, int]]:
        """(producer_id, first_offset) of aborted transactions overlapping [start, end),
        for Fetch responses to read_committed consumers."""
        out: list[tuple[int, int]] = []
        segs = self._log.segments
        i = max(0, bisect_right(self._log.bases, start_offset) - 1)
        for seg in segs[i:]:
            if seg.txn.collect(start_offset, end_offset, out):
                break
        return out
