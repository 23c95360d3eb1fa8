"""The per-partition recovery checkpoint: how far the log is known to be on disk.

At open, everything before the recovery point is trusted and only the bytes after
it are CRC-checked, so a restart does not read the whole log. The checkpoint is
written atomically (tmp + fsync + rename) and carries its own CRC-32C; a missing
or damaged checkpoint only makes recovery slower (a full scan), never wrong.

Layout (big-endian): b"SMRP" | version u8 | recovery_offset i64 | segment_base i64 |
position i64 | log_start_offset i64 | max_timestamp i64 | max_timestamp_offset i64 |
clean u8 | crc32c u32 of everything before it.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from . import checked_file

FILE_NAME = "recovery.checkpoint"
_MAGIC = b"SMRP"
_VERSION = 1
_BODY = struct.Struct(">4sBqqqqqqB")
SIZE = _BODY.size + 4   # body, then its CRC-32C (semel.storage.checked_file.seal)


@dataclass(frozen=True)
class Checkpoint:
    recovery_offset: int       # every offset below this is fsynced
    segment_base: int          # segment that holds recovery_offset ...
    position: int              # ... and the byte position of that offset in it
    log_start_offset: int
    max_timestamp: int         # running max timestamp of that segment up to the recovery point
    max_timestamp_offset: int
    clean: bool = False        # written by close(): nothing after the recovery point

    def encode(self) -> bytes:
        body = _BODY.pack(_MAGIC, _VERSION, self.recovery_offset, self.segment_base, self.position,
                          self.log_start_offset, self.max_timestamp, self.max_timestamp_offset,
                          1 if self.clean else 0)
        return checked_file.seal(body)


def decode(data: bytes) -> Checkpoint | None:
    """The checkpoint in data, or None when it is damaged or of an unknown version."""
    body = checked_file.unseal(data, SIZE)
    if body is None:
        return None
    magic, version, rec, seg, pos, start, max_ts, max_ts_off, clean = _BODY.unpack(body)
    if magic != _MAGIC or version != _VERSION or min(rec, seg, pos, start) < 0 or rec < seg:
        return None
    return Checkpoint(rec, seg, pos, start, max_ts, max_ts_off, bool(clean))
