"""After a failed fsync: the log's unflushed tail is no longer trusted, and is cut back.

On Linux a failed fsync may have dropped the dirty pages it was writing: the kernel
marks them clean and reports the error once, so a later fsync of the same file
succeeds without them and the page cache may go on serving bytes the disk never got
("fsyncgate"). So after a failed fsync of a log on a single node (no role in a
cluster) under flush_mode "always", where nothing past flushed_offset was
acknowledged by an acks=all answer or shown to a reader:
- the tail from flushed_offset on is untrusted: no later fsync moves flushed_offset,
  writes a recovery checkpoint, or answers a waiter for records in it;
- the loop cuts the log back to flushed_offset with the follower's truncation
  (ReplicaWrites.truncate_to: segments, indexes, transaction index, producer state and
  LSO follow) in check_writable, once a worker's write is settled: before the next
  write, when a waiter learns of the failure (GroupCommitFlusher.sync) and before a
  coordinator loads the log. So an idempotent producer's retry is written and fsynced
  again instead of being answered as a duplicate of records a power cut could take,
  and nothing replays what is about to go. A cut-back that fails takes the log offline.
A waiter holds the stamp its append was given (AppendInfo.fsync_stamp) and asks
`lost(stamp, upto)`: after a cut-back the same offsets are reused, so the offset alone
cannot tell a record that was cut from the retry written in its place.
In a cluster a log keeps the offline path instead (semel.cluster.offline): the broker
stops serving the partition and reopens the log from its files. Under flush_mode
"interval" or "never" records are acknowledged and readable before their fsync, so
nothing is cut: a failed fsync is reported and the next one is trusted as before.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Protocol

from .errors import StorageError
from .log_config import LogConfig

log = logging.getLogger("semel.storage")


class RepairedLog(Protocol):
    """What FsyncRepair needs of its log (PartitionLog)."""
    directory: Path
    config: LogConfig
    io_lock: threading.RLock
    state_lock: threading.Lock
    flushed_offset: int
    fsync_failures: int

    @property
    def standalone(self) -> bool: ...

    @property
    def failed_reason(self) -> str | None: ...

    @property
    def log_end_offset(self) -> int: ...

    def truncate_to(self, offset: int) -> int: ...

    def offline(self, reason: str) -> StorageError: ...


class FsyncRepair:
    """The trust a log puts in its unflushed tail after fsync failures (module docstring)."""

    def __init__(self, log: RepairedLog) -> None:
        self._log = log
        # flushed_offset when the first fsync failed since the last cut-back; None: trusted.
        self.untrusted_from: int | None = None
        self._cuts: list[int] = []   # where each cut-back cut, in order; a stamp indexes it

    def failed(self) -> None:
        """An fsync of the log failed (any thread, io_lock held): count it, and stop
        trusting the unflushed tail where the log is cut back for it (module docstring).
        Under state_lock, so a stamp or an advance on the loop sees both or neither."""
        plog = self._log
        with plog.state_lock:
            plog.fsync_failures += 1
            if self.untrusted_from is None and plog.standalone and plog.config.flush_mode == "always":
                self.untrusted_from = plog.flushed_offset
                log.error("%s: fsync failed; records from offset %d on are cut back before the next write",
                          plog.directory, plog.flushed_offset)

    @property
    def trusted(self) -> bool:
        return self.untrusted_from is None

    @property
    def cut_backs(self) -> int:
        """How many times this log cut an untrusted tail back."""
        return len(self._cuts)

    def advance(self, end: int) -> None:
        """An fsync that started after every write below `end` succeeded: flushed_offset
        moves there, unless an fsync failed meanwhile (its dropped pages are not vouched
        for by this one)."""
        plog = self._log
        with plog.state_lock:
            if self.untrusted_from is None and end > plog.flushed_offset:
                plog.flushed_offset = end

    def stamp(self) -> int | None:
        """What an append written now is given (AppendInfo.fsync_stamp): the number of
        cut-backs so far, -1 when written on an untrusted tail (it will be cut), None
        where this log is never cut back (nothing to compare)."""
        plog = self._log
        if not plog.standalone or plog.config.flush_mode != "always":
            return None
        with plog.state_lock:
            return len(self._cuts) if self.untrusted_from is None else -1

    def lost(self, stamp: int | None, upto: int) -> bool:
        """Are records before `upto`, appended with `stamp`, gone or bound to go: written
        on an untrusted tail, cut by a cut-back since, or past flushed_offset while the
        tail is untrusted? False for a None stamp."""
        if stamp is None:
            return False
        if stamp < 0 or any(cut < upto for cut in self._cuts[stamp:]):
            return True
        return self.untrusted_from is not None and upto > self._log.flushed_offset

    def run(self) -> None:
        """On the loop thread, nothing pending in a worker: cut an untrusted tail back to
        flushed_offset (the follower's truncation). Raises StorageError, with the log
        offline, when that fails."""
        if self.untrusted_from is None:
            return
        plog = self._log
        with plog.io_lock:          # no fsync runs meanwhile: flushed_offset stays put
            if self.untrusted_from is None:
                return
            cut = plog.flushed_offset
            self.untrusted_from = None    # first: the truncation's own checkpoint is trusted
            self._cuts.append(cut)
            try:
                if plog.truncate_to(cut) != cut:   # the batch boundary at `cut` was not found
                    raise StorageError(f"the log ends at {plog.log_end_offset}")
            except StorageError as exc:
                if plog.failed_reason is None:
                    raise plog.offline(f"cut-back to {cut} after a failed fsync failed: {exc}") from exc
                raise
            log.warning("%s: cut back to offset %d after a failed fsync", plog.directory, cut)
