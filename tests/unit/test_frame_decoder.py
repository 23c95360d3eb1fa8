"""FrameDecoder: any split of a byte stream into reads gives back exactly the frames
sent, in order, with the incomplete tail kept for the next read. Each frame is a
bytearray of its own (storage patches produce payloads in place)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semel.protocol.errors import ProtocolError
from semel.protocol.frame import FrameDecoder, frame


@settings(max_examples=300, deadline=None)
@given(payloads=st.lists(st.binary(max_size=600), max_size=12), cuts=st.lists(st.integers(0, 8000), max_size=20),
       as_view=st.booleans())
def test_any_split_gives_back_the_frames(payloads, cuts, as_view):
    stream = b"".join(frame(p) for p in payloads)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    dec = FrameDecoder(1000)
    got = []
    for a, b in zip(points, points[1:]):
        chunk = stream[a:b]
        out = dec.feed(memoryview(chunk) if as_view else chunk)
        assert all(type(f) is bytearray for f in out)
        got.extend(out)
        for f in out:       # owned by the caller: writing to one leaves the rest alone
            if f:
                f[0] ^= 0xFF
                f[0] ^= 0xFF
        # What is buffered is exactly the part of the stream not yet returned.
        assert dec.buffered == b - sum(4 + len(f) for f in got)
    assert got == payloads and dec.buffered == 0
    assert len({id(f) for f in got}) == len(got)


@pytest.mark.parametrize("size", [-1, 1001])
def test_a_size_outside_the_limit_is_a_protocol_error(size):
    dec = FrameDecoder(1000)
    assert dec.feed(frame(b"ok")[:3]) == []
    with pytest.raises(ProtocolError):
        dec.feed(frame(b"ok")[3:] + size.to_bytes(4, "big", signed=True))
