"""Producer ids handed out in blocks that stay unique across restarts.

Before any id of a block is used, the block's end is written durably (tmp
file, fsync, rename, fsync dir). After a crash the next block starts past
every id that could have been handed out, so ids are never reused. The same
file keeps the coordinator epoch, bumped once per start.

Every read and write goes through the storage FileSystem it is given, so a
disk failure there (or one injected in tests) refuses the reservation.
"""
from __future__ import annotations

import struct
from pathlib import Path

import crc32c

from ..storage.errors import StorageError
from ..storage.fs import FileSystem

BLOCK_SIZE = 1000
_REC = struct.Struct(">qiI")  # next block start, coordinator epoch, crc


class ProducerIdManager:
    def __init__(self, path: Path, fs: FileSystem | None = None):
        self.path = Path(path)
        self.fs = fs or FileSystem()
        self._next_block, self.coordinator_epoch = self._load()
        self.coordinator_epoch += 1
        self._next = self._end = self._next_block
        self._persist(self._next_block)

    def _load(self) -> tuple[int, int]:
        if not self.fs.exists(self.path):
            return 0, -1
        raw = self.fs.read_file(self.path)
        if len(raw) != _REC.size:
            raise StorageError(f"{self.path} is corrupt ({len(raw)} bytes, a reservation is {_REC.size}); "
                               "refusing to reuse producer ids")
        start, epoch, crc = _REC.unpack(raw)
        if crc32c.crc32c(raw[:-4]) != crc:
            raise StorageError(f"{self.path} is corrupt (checksum mismatch); refusing to reuse producer ids")
        return start, epoch

    def _persist(self, next_block: int) -> None:
        body = struct.pack(">qi", next_block, self.coordinator_epoch)
        try:
            self.fs.write_atomic(self.path, body + struct.pack(">I", crc32c.crc32c(body)))
        except OSError as exc:  # no id is handed out from a block that is not on disk
            raise StorageError(f"cannot reserve producer ids in {self.path}: {exc}") from exc

    async def reserve(self, want: int = 2) -> None:
        """Nothing to fetch ahead: `next_id` reserves the next block itself."""

    def next_id(self) -> int:
        if self._next >= self._end:
            self._persist(self._next_block + BLOCK_SIZE)
            self._next, self._end = self._next_block, self._next_block + BLOCK_SIZE
            self._next_block += BLOCK_SIZE
        pid = self._next
        self._next += 1
        return pid
