"""Length-prefixed framing (int32 size, then payload), sans-IO.

`FrameDecoder.feed()` takes whatever bytes arrived and returns the complete
frames; a size that is negative or over the configured maximum is a
ProtocolError (the connection is closed: nothing can be resynchronised).
"""
from __future__ import annotations

import struct

from .errors import ProtocolError

_SIZE = struct.Struct(">i")


class FrameDecoder:
    __slots__ = ("max_frame_bytes", "_buf")

    def __init__(self, max_frame_bytes: int = 100 * 1024 * 1024):
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        frames: list[bytes] = []
        buf = self._buf
        pos = 0
        while len(buf) - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size < 0 or size > self.max_frame_bytes:
                raise ProtocolError(f"frame size {size} outside 0..{self.max_frame_bytes}")
            if len(buf) - pos - 4 < size:
                break
            frames.append(bytes(buf[pos + 4:pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buf)


def frame(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload
