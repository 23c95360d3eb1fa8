"""Small value types shared by the log and the producer state."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AppendInfo:
    first_offset: int
    last_offset: int
    log_append_time: int = -1   # -1: batches keep their CreateTime timestamps
    duplicate: bool = False     # True: a retry of batches already in the log (nothing written)
    # What a waiter for these records' fsync hands back to the log (FsyncRepair.lost):
    # None where the log is never cut back after a failed fsync.
    fsync_stamp: int | None = None
