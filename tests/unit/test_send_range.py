"""broker.connection writes a follower's fetch answer holding a file range straight to
a plain TCP socket: os.sendfile for the range, the pieces around it written, corked;
from the first piece the socket does not take whole, the rest goes through the
transport, in order. A socket with a small send buffer whose peer reads only
afterwards makes the socket stop part-way."""
from __future__ import annotations

import asyncio
import os
import socket

import pytest
import uvloop

from semel.broker import connection
from semel.storage.file_range import FileRange


@pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
@pytest.mark.parametrize("sndbuf", [4096, 8 << 20], ids=["partial", "whole"])
def test_file_range_bytes_arrive_whole_and_in_order(tmp_path, sndbuf, new_loop, monkeypatch):
    data = os.urandom(3 << 20)
    path = tmp_path / "segment.log"
    path.write_bytes(b"junk" + data + b"more")
    received = bytearray()
    taken = []       # (piece kind, bytes the socket took)
    real = connection._send_piece

    def send_piece(fd, piece):
        n = real(fd, piece)
        taken.append((type(piece).__name__, n))
        return n
    monkeypatch.setattr(connection, "_send_piece", send_piece)

    async def main():
        done = asyncio.get_running_loop().create_future()

        async def serve(reader, writer):
            writer.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
            fd = os.open(path, os.O_RDONLY)
            try:
                rng = FileRange(fd, 4, len(data))
            finally:
                os.close(fd)          # the range holds its own descriptor
            connection._send_with_ranges(writer, [b"head", rng, bytearray(b"tail")])
            assert rng.fd == -1       # closed once handed over
            writer.write(b"next")
            await writer.drain()
            writer.close()
            done.set_result(None)

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.sleep(0.05)     # the server sends before anything is read here
        while chunk := await reader.read(1 << 20):
            received.extend(chunk)
        await done
        writer.close()
        server.close()
        await server.wait_closed()

    loop = new_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert bytes(received) == b"head" + data + b"tailnext"
    assert taken[0] == ("bytes", 4) and taken[1][0] == "FileRange" and taken[1][1] > 0
    if sndbuf == 4096:
        assert taken[1][1] < len(data) and len(taken) == 2    # the rest through the transport
    elif taken[1][1] == len(data):                            # all of it fitted: the tail too
        assert taken[2] == ("bytearray", 4)
