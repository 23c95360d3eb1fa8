"""An asyncio connection from one broker to another (follower fetching, OffsetForLeaderEpoch).

One request at a time per connection, which is how a replica fetcher uses it: the
next fetch is built from what the last one appended. Versions are fixed, not
negotiated: every broker of a cluster runs the same semel.
"""
from __future__ import annotations

import asyncio
import struct
from typing import Any

from ..protocol.messages import encode_request, request_class, response_class

_SIZE = struct.Struct(">i")
_CORR = struct.Struct(">i")


class PeerError(Exception):
    """The peer broke the protocol (wrong correlation id, oversized frame)."""


class PeerConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client_id: str,
                 max_frame: int):
        self._reader, self._writer = reader, writer
        self.client_id = client_id
        self._max_frame = max_frame
        self._corr = 0

    @classmethod
    async def open(cls, host: str, port: int, client_id: str, *, timeout_s: float = 10.0,
                   max_frame: int = 128 * 1024 * 1024) -> "PeerConnection":
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=1 << 20), timeout_s)
        return cls(reader, writer, client_id, max_frame)

    async def call(self, api_key: int, version: int, timeout_s: float, **fields) -> Any:
        """Send one request and wait for its response (asyncio.TimeoutError past timeout_s)."""
        self._corr += 1
        body = request_class(api_key)(version=version, **fields)
        self._writer.write(encode_request(api_key, version, self._corr, self.client_id, body))
        await self._writer.drain()
        return await asyncio.wait_for(self._response(api_key, version), timeout_s)

    async def _response(self, api_key: int, version: int) -> Any:
        size = _SIZE.unpack(await self._reader.readexactly(4))[0]
        if not 0 < size <= self._max_frame:
            raise PeerError(f"response frame of {size} bytes")
        frame = memoryview(await self._reader.readexactly(size))
        cls = response_class(api_key)
        corr = _CORR.unpack_from(frame)[0]
        if corr != self._corr:
            raise PeerError(f"correlation id {corr}, expected {self._corr}")
        start = _skip_tagged(frame, 4) if cls.flexible_version_q(version) else 4
        # Decoding from a view: the generic decode_response copies a follower's
        # megabyte-sized Fetch answers several times (about 40x slower here).
        return cls.decode(frame[start:], version=version)

    def close(self) -> None:
        self._writer.close()


def _uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 28:
            raise PeerError("bad varint in a response header")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _skip_tagged(buf: memoryview, pos: int) -> int:
    """Position after the tagged fields of a flexible response header."""
    count, pos = _uvarint(buf, pos)
    for _ in range(count):
        _, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        pos += size
    return pos
