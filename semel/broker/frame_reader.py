"""Request frames read straight from the socket into their own buffers.

asyncio's stream path copies each request four times before a handler sees it: the
event loop's read buffer into a bytes object, that into the StreamReader's
buffer, out again for `read()`, and once more into the frame. `FrameReader`
is a buffered protocol: the kernel writes small frames into one scratch buffer
(they are copied out, a few hundred bytes each) and a large frame's body
straight into the bytearray that becomes the frame, which the connection owns
(a produce request's records are views of it, patched in place by storage).

It takes over a plain TCP transport from the StreamReaderProtocol that
`asyncio.start_server` made; that protocol still handles the writing side
(pause/resume for `drain()`, connection loss), forwarded from here. A TLS
connection is taken over the same way: the event loop's SSL transport (uvloop's
SSLProtocol) decrypts straight into the buffer `get_buffer` lends, one TLS record
per call, so a large frame's plaintext lands in the frame's own bytearray too.
"""
from __future__ import annotations

import asyncio
from typing import Any, cast
import struct
from collections import deque

from ..protocol.errors import ProtocolError

_SIZE = struct.Struct(">i")
# Frames up to this size are assembled in the scratch buffer and copied out; larger
# ones get a buffer of their own that the kernel fills directly.
SMALL_FRAME = 64 * 1024
# Frames parsed but not yet taken by the connection before reading pauses.
MAX_READY_FRAMES = 64
# A large frame's buffer starts at most this big and doubles as its bytes arrive: a
# client announcing max_request_bytes and sending little must not make us hold it all.
FIRST_DIRECT_BYTES = 4 * 1024 * 1024


class FrameReader(asyncio.BufferedProtocol):
    """Frames of a plain TCP or TLS connection, read without copies (see module docstring)."""

    def __init__(self, inner: asyncio.StreamReaderProtocol, transport: asyncio.Transport, max_frame_bytes: int,
                 leftover: bytes = b""):
        self.inner = inner
        self.transport = transport
        self.max_frame_bytes = max_frame_bytes
        self._scratch = bytearray(SMALL_FRAME + 4)
        self._fill = 0                      # bytes of _scratch holding data
        self._frame: bytearray | None = None    # a large frame being filled in place
        self._size = 0                      # its announced size (the buffer may still be smaller)
        self._got = 0
        self._ready: deque[bytearray] = deque()
        self._error: ProtocolError | None = None
        self._eof = False
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        # Plain TCP stays half-open at the client's EOF (see eof_received); an SSL
        # transport closes itself there whatever the protocol answers (take_over says).
        self._keep_open_at_eof = True
        if leftover:
            self._take(leftover)

    @classmethod
    def take_over(cls, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  max_frame_bytes: int) -> "FrameReader":
        """Switch a fresh stream connection over to a FrameReader, with whatever the
        StreamReader buffered already (a client's first request can arrive before)."""
        # Private attributes, outside asyncio's typed API: there is no public way to take
        # a stream's buffer without awaiting, nor its protocol.
        stream_reader: Any = reader
        stream_writer: Any = writer
        inner = stream_writer._protocol            # StreamWriter keeps its protocol for drain()
        leftover = bytes(stream_reader._buffer)
        stream_reader._buffer.clear()
        me = cls(inner, cast(asyncio.Transport, writer.transport), max_frame_bytes, leftover)
        writer.transport.set_protocol(me)
        me._eof = stream_reader._eof
        me._keep_open_at_eof = writer.get_extra_info("ssl_object") is None
        return me

    # ---------------------------------------------------------------- reading side
    def get_buffer(self, sizehint: int) -> memoryview:
        if self._error is not None:         # reading is paused; whatever still comes is dropped
            return memoryview(bytearray(SMALL_FRAME))
        frame = self._frame
        if frame is not None:
            if self._got == len(frame):     # full so far: double it, up to the announced size
                frame.extend(bytes(min(len(frame), self._size - len(frame))))
            return memoryview(frame)[self._got:]
        return memoryview(self._scratch)[self._fill:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._error is not None:
            return
        if self._frame is not None:
            self._got += nbytes
            if self._got == self._size:
                self._ready.append(self._frame)
                self._frame = None
                self._wake()
            return
        self._fill += nbytes
        self._parse()

    def _take(self, data: bytes) -> None:
        """Bytes that arrived before the switch, fed as if read now."""
        view = memoryview(data)
        while view and self._error is None:
            buf = self.get_buffer(len(view))
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            buf.release()
            view = view[n:]
            self.buffer_updated(n)

    def _parse(self) -> None:
        scratch, fill, pos = self._scratch, self._fill, 0
        with memoryview(scratch) as view:
            while fill - pos >= 4:
                (size,) = _SIZE.unpack_from(view, pos)
                if size < 0 or size > self.max_frame_bytes:
                    self._fail(ProtocolError(f"frame size {size} outside 0..{self.max_frame_bytes}"))
                    return
                have = fill - pos - 4
                if have >= size:
                    self._ready.append(bytearray(view[pos + 4:pos + 4 + size]))
                    pos += 4 + size
                elif size > SMALL_FRAME:
                    frame = bytearray(min(size, max(FIRST_DIRECT_BYTES, have)))
                    frame[:have] = view[pos + 4:fill]
                    self._frame, self._size, self._got = frame, size, have
                    pos = fill
                    break
                else:
                    break
        if pos:
            rest = fill - pos
            scratch[:rest] = scratch[pos:fill]
            self._fill = rest
        if self._ready:
            self._wake()

    def _fail(self, exc: ProtocolError) -> None:
        self._error = exc
        self.transport.pause_reading()
        self._wake()

    def _wake(self) -> None:
        if len(self._ready) >= MAX_READY_FRAMES and not self._paused and not self._eof:
            self._paused = True
            self.transport.pause_reading()
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def next(self) -> list[bytearray] | None:
        """The frames read so far (waiting for at least one); None at end of stream.
        Raises ProtocolError once the frames before the bad size are taken."""
        while not self._ready:
            if self._error is not None:
                raise self._error
            if self._eof:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        frames = list(self._ready)
        self._ready.clear()
        if self._paused:
            self._paused = False
            self.transport.resume_reading()
        return frames

    @property
    def buffered(self) -> int:
        """Bytes of frames not complete yet (the stalled-frame sweep reads it)."""
        return self._fill + (self._got if self._frame is not None else 0)

    # ---------------------------------------------------------------- the rest
    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        # Keep the transport open, as the stream protocol did for plain TCP: responses
        # to what the client sent before shutting its side down still go out, and the
        # connection closes the writer when they have.
        return self._keep_open_at_eof

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._wake()
        self.inner.connection_lost(exc)     # wakes drain() waiters, closes the writer side

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()
