"""Producer ids handed out in blocks that stay unique across restarts.

Before any id of a block is used, the block's end is written durably (tmp
file, fsync, rename, fsync dir). After a crash the next block starts past
every id that could have been handed out, so ids are never reused. The same
file keeps the coordinator epoch, bumped once per start.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

import crc32c

from ..storage.errors import StorageError

BLOCK_SIZE = 1000
_REC = struct.Struct(">qiI")  # next block start, coordinator epoch, crc


class ProducerIdManager:
    def __init__(self, path: Path, fs=None):
        self.path = Path(path)
        self._next_block, self.coordinator_epoch = self._load()
        self.coordinator_epoch += 1
        self._next = self._end = self._next_block
        self._persist(self._next_block)

    def _load(self) -> tuple[int, int]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return 0, -1
        start, epoch, crc = _REC.unpack(raw[:_REC.size])
        if crc32c.crc32c(raw[:12]) != crc:
            raise RuntimeError(f"{self.path} is corrupt; refusing to reuse producer ids")
        return start, epoch

    def _persist(self, next_block: int) -> None:
        body = struct.pack(">qi", next_block, self.coordinator_epoch)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(body + struct.pack(">I", crc32c.crc32c(body)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def next_id(self) -> int:
        if self._next >= self._end:
            try:
                self._persist(self._next_block + BLOCK_SIZE)
            except OSError as exc:  # no id is handed out from a block that is not on disk
                raise StorageError(f"cannot reserve producer ids in {self.path}: {exc}") from exc
            self._next, self._end = self._next_block, self._next_block + BLOCK_SIZE
            self._next_block += BLOCK_SIZE
        pid = self._next
        self._next += 1
        return pid
