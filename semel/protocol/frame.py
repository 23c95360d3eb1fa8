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

    def feed(self, data: bytes) -> list[bytearray]:
        """Complete frames (payloads) from what is buffered plus `data`.

        Each payload is copied once, straight out of `data` when nothing was
        buffered (the common case: whole requests per read), and only an
        incomplete tail is kept. Frames are bytearrays that belong to the caller:
        a produce request's records are views of its frame, and storage patches
        their offsets in place instead of copying the payload again."""
        buf = self._buf
        src: bytes | bytearray
        if buf:
            buf += data
            src = buf
        else:
            src = data
        frames: list[bytearray] = []
        pos = 0
        with memoryview(src) as view:
            end = len(view)
            while end - pos >= 4:
                (size,) = _SIZE.unpack_from(view, pos)
                if size < 0 or size > self.max_frame_bytes:
                    raise ProtocolError(f"frame size {size} outside 0..{self.max_frame_bytes}")
                if end - pos - 4 < size:
                    break
                frames.append(bytearray(view[pos + 4:pos + 4 + size]))
                pos += 4 + size
            if src is not buf:
                buf += view[pos:]
        if src is buf and pos:
            del buf[:pos]
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buf)


def frame(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload
