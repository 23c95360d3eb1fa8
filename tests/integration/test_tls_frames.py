"""TLS connections read their frames through the same FrameReader as plain TCP
(semel.broker.frame_reader): uvloop's SSL transport decrypts into the buffer the
reader lends, one TLS record per call. These tests drive a real broker's SSL
listener with a raw TLS socket, so the record boundaries are the test's own."""
from __future__ import annotations

import socket
import ssl

import pytest

from semel.client import Client
from semel.launch.process import SemelBroker, free_port, wait_for_port
from semel.protocol.errors import KafkaError
from tests.integration.test_hotpath import _batch, _produce_frame, _read_frame, trickle_and_check
from semel.testing.certs import make_certs


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls-frames")
    ca, cert, key = make_certs(d)
    port = free_port()
    b = SemelBroker(d / "data", log_path=d / "broker.log", extra_args=[
        "--listener", f"SSL://127.0.0.1:{port}", "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)])
    b.start()
    try:
        wait_for_port("127.0.0.1", port, 60)
        b.tls_port, b.ca = port, ca
        yield b
    finally:
        b.close()


def _tls_socket(b) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=str(b.ca))
    raw = socket.create_connection(("127.0.0.1", b.tls_port), timeout=30)
    return ctx.wrap_socket(raw, server_hostname="127.0.0.1")


def test_a_large_frame_in_small_tls_records_is_stored_as_sent_and_answered(tls_broker):
    """The hot path's trickle test over TLS: each 7 KB sendall is one TLS record, so the
    big frame's plaintext arrives record by record and the last record holds its end
    and a whole small frame."""
    trickle_and_check(tls_broker.bootstrap, "tls-trickle", lambda: _tls_socket(tls_broker))


def test_many_frames_in_one_tls_record_are_answered_in_order(tls_broker):
    """Forty small frames in a single TLS record: forty answers, in request order."""
    with Client(tls_broker.bootstrap) as c:
        assert c.create_topic("tls-many", 1) == KafkaError.NONE
    stream = b"".join(_produce_frame("tls-many", _batch([b"v%d" % i]), 100 + i) for i in range(40))
    with _tls_socket(tls_broker) as sock:
        sock.sendall(stream)
        ids = [int.from_bytes(_read_frame(sock)[:4], "big") for _ in range(40)]
    assert ids == list(range(100, 140))
    with Client(tls_broker.bootstrap) as c:
        assert c.list_offset("tls-many", 0, -1) == 40


def test_a_tls_close_notify_closes_the_connection_quietly(tls_broker):
    """A client ending its TLS session (close_notify) gets the connection closed, and the
    broker's log says nothing about it (an SSL transport ignores a protocol's wish to
    stay half-open, and asyncio logs a warning when one asks, before it answers the
    close_notify that unwrap() waits for)."""
    with Client(tls_broker.bootstrap) as c:
        assert c.create_topic("tls-quiet", 1) == KafkaError.NONE
    with _tls_socket(tls_broker) as sock:
        sock.sendall(_produce_frame("tls-quiet", _batch([b"x"]), 7))
        assert _read_frame(sock)[:4] == (7).to_bytes(4, "big")
        raw = sock.unwrap()   # sends close_notify and waits for the broker's
        assert raw.recv(1) == b""
        raw.close()
    assert "eof_received" not in tls_broker.log_path.read_text()
