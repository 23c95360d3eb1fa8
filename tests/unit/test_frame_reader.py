"""FrameReader (semel.broker.frame_reader): the buffered protocol gives back exactly the
frames sent, in order, whatever sizes the socket reads come in, with large frames
read into their own buffers; a bad size is a ProtocolError after the frames before
it; reading pauses while too many frames wait and resumes when they are taken; the
bytes that arrived before the switch count; the writing side is forwarded."""
from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semel.broker import frame_reader as fr
from semel.broker.frame_reader import FrameReader
from semel.protocol.errors import ProtocolError
from semel.protocol.frame import frame


class FakeTransport:
    def __init__(self):
        self.paused = False
        self.pauses = 0

    def pause_reading(self):
        self.paused = True
        self.pauses += 1

    def resume_reading(self):
        self.paused = False


class FakeInner:
    def __init__(self):
        self.calls = []

    def connection_lost(self, exc):
        self.calls.append(("lost", exc))

    def pause_writing(self):
        self.calls.append("pause")

    def resume_writing(self):
        self.calls.append("resume")


def deliver(reader: FrameReader, stream: bytes, reads: list[int]) -> None:
    """What the event loop does: get_buffer, the kernel fills some of it, buffer_updated."""
    pos, k = 0, 0
    while pos < len(stream):
        buf = reader.get_buffer(-1)
        want = reads[k % len(reads)] if reads else len(buf)
        k += 1
        n = max(1, min(len(buf), want, len(stream) - pos))
        buf[:n] = stream[pos:pos + n]
        buf.release()
        pos += n
        reader.buffer_updated(n)


def take_all(reader: FrameReader) -> list[bytearray]:
    async def run():
        got = []
        while reader._ready:
            got.extend(await reader.next())
        return got
    return asyncio.run(run())


sizes = st.one_of(st.integers(0, 300), st.integers(fr.SMALL_FRAME - 8, fr.SMALL_FRAME + 8),
                  st.integers(fr.SMALL_FRAME + 9, 3 * fr.SMALL_FRAME))


@settings(max_examples=120, deadline=None)
@given(st.lists(sizes, max_size=8), st.lists(st.integers(1, 200_000), max_size=10),
       st.integers(0, 80), st.randoms(use_true_random=False))
def test_any_read_sizes_give_back_the_frames(lengths, reads, leftover_len, rnd):
    payloads = [bytes(rnd.getrandbits(8) for _ in range(min(n, 64))) * (n // 64 + 1) for n in lengths]
    payloads = [p[:n] for p, n in zip(payloads, lengths)]
    stream = b"".join(frame(p) for p in payloads)
    cut = min(leftover_len, len(stream))
    reader = FrameReader(FakeInner(), FakeTransport(), 10 * fr.SMALL_FRAME, leftover=stream[:cut])
    got = take_all(reader)
    deliver(reader, stream[cut:], reads)
    got += take_all(reader)
    assert got == payloads
    assert all(type(f) is bytearray for f in got)
    assert reader.buffered == 0


def test_a_large_frame_grows_its_buffer_as_bytes_arrive():
    """A client announcing a huge frame gets a buffer of FIRST_DIRECT_BYTES, not its
    announced size; the frame still arrives whole."""
    size = 3 * fr.FIRST_DIRECT_BYTES + 5
    reader = FrameReader(FakeInner(), FakeTransport(), 4 * fr.FIRST_DIRECT_BYTES)
    head = frame(b"")[:0] + size.to_bytes(4, "big") + b"a" * 100
    deliver(reader, head, [])
    assert reader._frame is not None and len(reader._frame) == fr.FIRST_DIRECT_BYTES
    assert reader.buffered == 100
    deliver(reader, b"b" * (size - 100), [1 << 20])
    (got,) = take_all(reader)
    assert len(got) == size and got[:100] == b"a" * 100 and got[-1:] == b"b"


@pytest.mark.parametrize("size", [-1, 10 * fr.SMALL_FRAME + 1])
def test_a_bad_size_is_a_protocol_error_after_the_frames_before_it(size):
    transport = FakeTransport()
    reader = FrameReader(FakeInner(), transport, 10 * fr.SMALL_FRAME)
    deliver(reader, frame(b"ok") + size.to_bytes(4, "big", signed=True) + b"rest", [])
    assert transport.paused

    async def run():
        assert await reader.next() == [b"ok"]
        with pytest.raises(ProtocolError):
            await reader.next()
    asyncio.run(run())


def test_reading_pauses_while_frames_wait_and_resumes_once_taken():
    transport = FakeTransport()
    reader = FrameReader(FakeInner(), transport, 1000)
    deliver(reader, b"".join(frame(b"x%d" % i) for i in range(fr.MAX_READY_FRAMES)), [])
    assert transport.paused

    async def run():
        assert len(await reader.next()) == fr.MAX_READY_FRAMES
    asyncio.run(run())
    assert not transport.paused


def test_end_of_stream_and_the_writing_side():
    inner = FakeInner()
    reader = FrameReader(inner, FakeTransport(), 1000)
    reader.pause_writing()
    reader.resume_writing()
    err = ConnectionResetError()
    reader.connection_lost(err)
    assert inner.calls == ["pause", "resume", ("lost", err)]

    async def run():
        assert await reader.next() is None
    asyncio.run(run())
