"""semel.cluster.peer: one request at a time between brokers, responses decoded from a view."""
from __future__ import annotations

import asyncio
import struct

import pytest

from semel.cluster.peer import PeerConnection, PeerError, _skip_tagged
from semel.protocol.messages import encode_response, request_class, response_class


def test_skip_tagged_fields_of_a_header():
    buf = memoryview(bytes([2, 0, 3, 9, 9, 9, 1, 0, 0x55]))
    assert _skip_tagged(buf, 0) == 8
    assert _skip_tagged(memoryview(b"\x00\x55"), 0) == 1
    with pytest.raises(PeerError):
        _skip_tagged(memoryview(b"\x80"), 0)


def _fetch_response(records: bytes):
    cls = response_class(1)
    T = cls.FetchableTopicResponse
    P = T.PartitionData
    return cls(version=12, throttle_time_ms=0, error_code=0, session_id=0, responses=[T(topic="t", partitions=[
        P(partition_index=3, error_code=0, high_watermark=7, last_stable_offset=7, log_start_offset=0,
          aborted_transactions=None, preferred_read_replica=-1, records=records)])])


def test_call_decodes_the_answer_and_checks_the_correlation_id():
    async def run():
        answers = [1, 99]    # the second answer carries a wrong correlation id

        async def serve(reader, writer):
            for corr in answers:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                await reader.readexactly(size)
                writer.write(encode_response(1, 12, corr, _fetch_response(b"r" * 100_000)))
                await writer.drain()
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conn = await PeerConnection.open("127.0.0.1", port, "test")
        try:
            T = request_class(1).FetchTopic
            fields = dict(replica_id=1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                          session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
                          topics=[T(topic="t", partitions=[T.FetchPartition(
                              partition=3, current_leader_epoch=0, fetch_offset=0, last_fetched_epoch=-1,
                              log_start_offset=0, partition_max_bytes=1 << 20)])])
            resp = await conn.call(1, 12, 5, **fields)
            p = resp.responses[0].partitions[0]
            assert (p.partition_index, p.high_watermark, bytes(p.records)) == (3, 7, b"r" * 100_000)
            with pytest.raises(PeerError):
                await conn.call(1, 12, 5, **fields)
        finally:
            conn.close()
            server.close()
            await server.wait_closed()
    asyncio.run(run())


def _serving(chunks):
    """A server that answers each request with `chunks()`: byte strings it writes one by
    one, draining between them, so the client sees them in separate reads (None: hang up)."""
    async def serve(reader, writer):
        try:
            while True:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                await reader.readexactly(size)
                for piece in chunks():
                    if piece is None:          # hang up here
                        return
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
    return serve


async def _fetch(conn):
    T = request_class(1).FetchTopic
    return await conn.call(1, 12, 5, replica_id=1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
                           isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=[],
                           rack_id="", topics=[T(topic="t", partitions=[T.FetchPartition(
                               partition=3, current_leader_epoch=0, fetch_offset=0, last_fetched_epoch=-1,
                               log_start_offset=0, partition_max_bytes=1 << 20)])])


def _with_server(serve, body, max_frame=128 * 1024 * 1024):
    async def run():
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        conn = await PeerConnection.open("127.0.0.1", server.sockets[0].getsockname()[1], "test",
                                         max_frame=max_frame)
        try:
            await body(conn)
        finally:
            conn.close()
            server.close()
            await server.wait_closed()
    asyncio.run(run())


def test_frames_split_anywhere_arrive_whole_and_in_order():
    """The size prefix and the body received in pieces of any size (one byte, a prefix
    split in two, a body across many reads): each answer is decoded from exactly its bytes."""
    corr = iter(range(1, 100))

    def chunks():
        n = next(corr)
        frame = encode_response(1, 12, n, _fetch_response(bytes([n]) * (50_000 + n)))
        cuts = sorted({1, 3, 4, 5, 9, 4096, len(frame) // 2, len(frame) - 1} | set(range(10, 40 * n, 7 * n)))
        return [frame[a:b] for a, b in zip([0] + cuts, cuts + [len(frame)])]

    async def body(conn):
        for n in range(1, 6):
            p = (await _fetch(conn)).responses[0].partitions[0]
            assert bytes(p.records) == bytes([n]) * (50_000 + n)
    _with_server(_serving(chunks), body)


def test_an_oversized_frame_or_a_connection_ending_midway_fails_the_call_and_every_later_one():
    big = encode_response(1, 12, 1, _fetch_response(b"x" * 5000))

    async def too_big(conn):
        for _ in range(2):
            with pytest.raises(PeerError):
                await _fetch(conn)
        assert not conn.usable()
    _with_server(_serving(lambda: [big]), too_big, max_frame=4096)

    async def cut(conn):
        for _ in range(2):
            with pytest.raises(asyncio.IncompleteReadError):
                await _fetch(conn)
        assert not conn.usable()
    _with_server(_serving(lambda: [big[:3000], None]), cut)
