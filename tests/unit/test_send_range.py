"""broker.connection sends a follower's records as a file range: os.sendfile for as
much as the socket takes, the rest read and written through the transport, in order
with what was written before and after. A socket with a small send buffer whose peer
reads only afterwards makes sendfile stop part-way."""
from __future__ import annotations

import asyncio
import os
import socket

import pytest
import uvloop

from semel.broker import connection
from semel.broker.connection import _send_range
from semel.storage.file_range import FileRange


@pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
@pytest.mark.parametrize("sndbuf", [4096, 1 << 20], ids=["partial", "whole"])
def test_file_range_bytes_arrive_whole_and_in_order(tmp_path, sndbuf, new_loop, monkeypatch):
    data = os.urandom(3 << 20)
    path = tmp_path / "segment.log"
    path.write_bytes(b"junk" + data + b"more")
    received = bytearray()
    sent_by_sendfile = []
    real = connection._sendfile
    monkeypatch.setattr(connection, "_sendfile", lambda t, r: sent_by_sendfile.append(real(t, r)) or sent_by_sendfile[-1])

    async def main():
        done = asyncio.get_running_loop().create_future()

        async def serve(reader, writer):
            writer.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
            fd = os.open(path, os.O_RDONLY)
            try:
                rng = FileRange(fd, 4, len(data))
            finally:
                os.close(fd)          # the range holds its own descriptor
            writer.write(b"head")
            _send_range(writer, rng)
            assert rng.fd == -1       # closed once handed over
            writer.write(b"tail")
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
    assert bytes(received) == b"head" + data + b"tail"
    assert 0 < sent_by_sendfile[0] <= len(data)
    if sndbuf == 4096:
        assert sent_by_sendfile[0] < len(data)      # the rest went through the transport
