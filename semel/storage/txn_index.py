"""Aborted-transaction index of one segment: `<base>.txnindex`.

One fixed-size entry (32 bytes, big-endian) per ABORT marker stored in the
segment, in marker order:
    producer_id i64 | first_offset i64 | last_offset i64 (the marker) | last_stable_offset i64
last_stable_offset is the partition's LSO just after the marker. It lets a
search stop early: once an entry's LSO reaches the end of the range asked about,
no later abort can overlap that range (every transaction still open then began
at or after that LSO).

Fetch answers read_committed clients with (producer_id, first_offset) of each
aborted transaction overlapping the fetched range; the client drops that
producer's transactional batches from first_offset until the ABORT marker.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import NamedTuple

from .fs import FileSystem

_ENTRY = struct.Struct(">qqqq")
ENTRY_SIZE = _ENTRY.size


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class TxnIndex:
    __slots__ = ("fs", "path", "entries", "persisted")

    def __init__(self, fs: FileSystem, path: Path):
        self.fs = fs
        self.path = path
        self.entries: list[AbortedTxn] = []
        self.persisted = 0          # entries already in the file

    def append(self, entry: AbortedTxn) -> None:
        self.entries.append(entry)

    def persist(self, sync: bool) -> None:
        """Write new entries. They are fsynced whenever there are new ones: unlike the
        offset index, an entry below the recovery point cannot be rebuilt later."""
        n = len(self.entries)
        if n == self.persisted and not sync:
            return
        f = self.fs.open(self.path)
        try:
            if n > self.persisted:
                data = b"".join(_ENTRY.pack(*e) for e in self.entries[self.persisted:n])
                self.fs.pwrite(f, data, ENTRY_SIZE * self.persisted)
            self.fs.fsync(f)
        finally:
            self.fs.close(f)
        self.persisted = n

    def load(self, limit_offset: int) -> None:
        """Read the file, keeping entries whose marker is below limit_offset (the rest
        is rebuilt by the recovery replay); the file is cut to what was kept."""
        try:
            data = self.fs.read_file(self.path)
        except FileNotFoundError:
            data = b""
        kept: list[AbortedTxn] = []
        prev = -1
        for pos in range(0, len(data) - len(data) % ENTRY_SIZE, ENTRY_SIZE):
            e = AbortedTxn(*_ENTRY.unpack_from(data, pos))
            # (a marker always follows its first record, so first < last; all-zero junk fails)
            if e.last_offset <= prev or e.last_offset >= limit_offset or not 0 <= e.first_offset < e.last_offset:
                break
            kept.append(e)
            prev = e.last_offset
        self.entries = kept
        self.persisted = len(kept)
        self._cut(ENTRY_SIZE * len(kept), len(data))

    def reset(self) -> None:
        self.entries, self.persisted = [], 0
        self._cut(0, -1)

    def truncate_to(self, end_offset: int) -> None:
        """Drop entries whose marker is at or after end_offset (the log was cut there)."""
        keep = len(self.entries)
        while keep and self.entries[keep - 1].last_offset >= end_offset:
            keep -= 1
        if keep < len(self.entries):
            del self.entries[keep:]
            if self.persisted > keep:
                self.persisted = keep
                self._cut(ENTRY_SIZE * keep, -1)

    def _cut(self, size: int, had: int) -> None:
        if had == size:
            return
        f = self.fs.open(self.path)
        try:
            if self.fs.size(f) != size:
                self.fs.truncate(f, size)
        finally:
            self.fs.close(f)

    def collect(self, start: int, end: int, out: list[tuple[int, int]]) -> bool:
        """Add overlapping entries to out; True when no later segment can add more."""
        for e in self.entries:
            if e.last_offset >= start and e.first_offset < end:
                out.append((e.producer_id, e.first_offset))
            if e.last_stable_offset >= end:
                return True
        return False
