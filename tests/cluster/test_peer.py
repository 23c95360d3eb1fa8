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
