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

While a large frame arrives, the socket's receive low-water mark (SO_RCVLOWAT)
is raised so the event loop wakes once up to 256 KiB are waiting, not for
every segment: a TLS client writes a produce request as 16 KiB records, and the
broker woke for every one or two of them (about 30,000 wake-ups per GB, each an
epoll round, a read, a decryption call and a context switch on the VM; 1 CPU-s
per GB more than plain TCP). The mark never asks for more bytes than the frame
still lacks, less what the TLS layer may hold already undecrypted, so the client
can always complete it without the broker answering first.
"""
from __future__ import annotations

import asyncio
import socket
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
# The receive low-water mark while a large frame arrives: at most this many bytes...
LOWAT_MAX = 256 * 1024
# ...and this much below what the frame still lacks. A TLS transport decrypts all it
# read unless the frame's buffer filled up, so it can hold at most one partial TLS
# record (16 KiB and a header) of the frame undecrypted: those bytes will never reach
# the socket again, and a mark counting them could wait forever.
LOWAT_MARGIN = 32 * 1024
# Marks below this are not worth a system call: the default (1) is set instead.
LOWAT_MIN = 32 * 1024


class FrameReader(asyncio.BufferedProtocol):
    """Frames of a plain TCP or TLS connection, read without copies (see module docstring)."""

    def __init__(self, inner: asyncio.StreamReaderProtocol, transport, max_frame_bytes: int,
                 leftover: bytes = b"", sock=None):
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
        self._waiter: asyncio.Future | None = None
        self._paused = False
        self._sock = sock                   # the TCP socket whose SO_RCVLOWAT paces large frames
        self._lowat = 1
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
        inner = writer._protocol            # StreamWriter keeps its protocol for drain()
        leftover = bytes(reader._buffer)    # no public way to take it without awaiting
        reader._buffer.clear()
        sock = writer.get_extra_info("socket")
        tcp = sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6)
        me = cls(inner, writer.transport, max_frame_bytes, leftover, sock if tcp else None)
        writer.transport.set_protocol(me)
        me._eof = reader._eof
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
            self._pace()
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
                    self._pace()
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

    def _pace(self) -> None:
        """Sets the socket's low-water mark for the large frame being filled (see the
        module docstring), or back to 1 when there is none or its buffer is full (the
        transport may then hold more of it than one record, and reads on at once)."""
        frame, want, sock = self._frame, 1, self._sock
        if sock is None:
            return
        try:
            if frame is not None and self._got < len(frame):
                want = min(LOWAT_MAX, self._size - self._got - LOWAT_MARGIN)
                if want > self._lowat:
                    # A mark above a quarter of the receive buffer makes the kernel grow
                    # the buffer and clamp the TCP window to the mark: the client then
                    # stops at every mark until the broker reads (half the throughput).
                    want = min(want, sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 4)
                if want < LOWAT_MIN:
                    want = 1
            if want != self._lowat:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
                self._lowat = want
        except OSError:                 # a socket closed under us: nothing more to pace
            self._sock = None

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

    def connection_lost(self, exc) -> None:
        self._eof = True
        self._wake()
        self.inner.connection_lost(exc)     # wakes drain() waiters, closes the writer side

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()
