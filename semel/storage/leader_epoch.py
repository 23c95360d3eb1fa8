"""Leader-epoch cache of one partition log: which leader epoch began at which offset.

Every batch a leader appends carries its leader epoch (partitionLeaderEpoch), and
the first offset written in each epoch is remembered here. A follower that comes
back after a leader change asks the new leader where its own latest epoch ended
(OffsetForLeaderEpoch, KIP-101/KIP-279) and truncates there, so a tail that the
old leader never got replicated cannot survive next to different records at the
same offsets.

The cache is persisted as `leader-epoch.checkpoint` in the partition directory,
replaced atomically (tmp + fsync + rename) on every change; changes are rare (one
per leader change, one per truncation). A missing or damaged file reads as an
empty cache: the next leader change rebuilds it from then on.

Layout (text, one line each): "semel-epochs 1 <crc32c hex of the rest>", then
"<epoch> <start_offset>" per entry, epochs and offsets strictly increasing.
"""
from __future__ import annotations

import logging
from bisect import bisect_right
from pathlib import Path

from . import checked_file
from .fs import FileSystem

log = logging.getLogger("semel.storage")

FILE_NAME = "leader-epoch.checkpoint"
_HEADER = "semel-epochs 1 "
UNDEFINED = -1


class LeaderEpochCache:
    """(epoch, start offset) pairs in increasing order; see the module docstring."""

    def __init__(self, fs: FileSystem, directory: Path, entries: list[tuple[int, int]] | None = None):
        self.fs = fs
        self.path = Path(directory) / FILE_NAME
        self.entries: list[tuple[int, int]] = list(entries or [])

    @classmethod
    def load(cls, fs: FileSystem, directory: Path) -> "LeaderEpochCache":
        cache = cls(fs, directory)
        try:
            data = fs.read_file(cache.path)
        except FileNotFoundError:
            return cache
        entries = decode(data)
        if entries is None:
            log.warning("%s is damaged; leader epochs are known again from the next leader change", cache.path)
        else:
            cache.entries = entries
        return cache

    # -- queries -------------------------------------------------------------------------
    @property
    def latest_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else UNDEFINED

    def start_offset(self, epoch: int) -> int | None:
        for e, start in self.entries:
            if e == epoch:
                return start
        return None

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) answering OffsetForLeaderEpoch for `epoch` (KIP-279).

        The latest epoch ends at the log end. An older one ends where the next larger
        epoch starts, and the answer names the largest epoch at or below the one asked
        (the asker may never have seen it). An epoch above every known one, or any
        question to an empty cache, is (UNDEFINED, UNDEFINED)."""
        if not self.entries or epoch == UNDEFINED:
            return UNDEFINED, UNDEFINED
        if epoch == self.latest_epoch:
            return epoch, log_end_offset
        epochs = [e for e, _ in self.entries]
        i = bisect_right(epochs, epoch)          # first entry with a larger epoch
        if i == len(epochs):
            return UNDEFINED, UNDEFINED
        higher_start = self.entries[i][1]
        return (epoch if i == 0 else epochs[i - 1]), higher_start

    # -- changes (each persisted before it returns) -------------------------------------
    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` begins at `start_offset`; True when the cache changed.

        An epoch at or below the latest is ignored (it already began earlier). Entries
        starting at or after start_offset describe a tail that no longer exists, so
        they go."""
        if epoch < 0 or epoch <= self.latest_epoch:
            return False
        kept = [(e, s) for e, s in self.entries if e < epoch and s < start_offset]
        self.entries = kept + [(epoch, start_offset)]
        self._persist()
        return True

    def truncate_from_end(self, end_offset: int) -> None:
        """The log was cut at end_offset: epochs that began at or after it are gone."""
        kept = [(e, s) for e, s in self.entries if s < end_offset]
        if kept != self.entries:
            self.entries = kept
            self._persist()

    def _persist(self) -> None:
        self.fs.write_atomic(self.path, encode(self.entries), sync_dir=True)


def encode(entries: list[tuple[int, int]]) -> bytes:
    return checked_file.encode(_HEADER, "".join(f"{e} {s}\n" for e, s in entries).encode())


def decode(data: bytes) -> list[tuple[int, int]] | None:
    """The entries in data, or None when the file is damaged or not increasing."""
    body = checked_file.decode(_HEADER, data)
    if body is None:
        return None
    out: list[tuple[int, int]] = []
    try:
        for line in body.decode("ascii").splitlines():
            e, s = (int(x) for x in line.split())
            if out and (e <= out[-1][0] or s < out[-1][1]):
                return None
            out.append((e, s))
    except ValueError:
        return None
    return out
