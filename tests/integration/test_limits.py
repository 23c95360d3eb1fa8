"""Limits on what one client can take: connections per address and in
all, idle connections, half-sent frames, oversized frames, partitions per request.
Each over-limit case closes that one connection with a log line; a well-behaved
client on the same broker is answered throughout."""
from __future__ import annotations

import struct
import subprocess
import sys
import time

import pytest

from semel.client import Client
from semel.protocol.messages import request_class
from tests.support import wait
from tests.support.brokers import module_broker
from tests.support.wire import call, closed_by_peer, connect, recv_frame, request_bytes

F = request_class(1)


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    with module_broker(tmp_path_factory, "limits", "--max-connections-per-ip", "6",
                       "--connections-max-idle-ms", "1500", "--request-timeout-ms", "1000",
                       "--max-partitions-per-request", "50", "--max-request-bytes", "65536") as b:
        with Client(b.bootstrap) as c:
            c.create_topic("lim", 2)
        yield b


def _log(b) -> str:
    return b.log_path.read_text(errors="replace")


def _bystander_ok(b) -> None:
    """A well-behaved client is answered (once connections the test closed are
    released: the broker sees a close a moment after the client makes it)."""
    wait.until(lambda: _try_metadata(b), "a well-behaved client answered", timeout_s=30)


def _working_connection(b):
    """A connection the broker has accepted and counted (it answered a request)."""
    def attempt():
        s = connect(b.bootstrap)
        try:
            if _metadata(s) is not None:
                return s
        except OSError:
            pass
        s.close()
        return None
    return wait.until(attempt, "a connection accepted", timeout_s=30)


def _metadata(s) -> object:
    return call(s, 3, 9, topics=None, allow_auto_topic_creation=False)


def test_connections_over_the_per_address_limit_are_closed_at_once(limited):
    held = [_working_connection(limited) for _ in range(6)]   # up to the limit: all work
    try:
        sixth = held.pop()
        over = connect(limited.bootstrap)
        assert closed_by_peer(over)                 # 7th: closed before any request
        over.close()
        wait.until(lambda: "max_connections_per_ip=6 reached" in _log(limited), "a log line for the refusal")
        sixth.close()
        # A slot freed is a slot usable again.
        wait.until(lambda: _try_metadata(limited), "a connection accepted once one closed")
    finally:
        for s in held:
            s.close()
    _bystander_ok(limited)


def _try_metadata(b) -> bool:
    with connect(b.bootstrap) as s:
        try:
            return _metadata(s) is not None
        except OSError:
            return False


def test_idle_connection_is_closed_and_busy_one_is_not(limited):
    with connect(limited.bootstrap) as idle, connect(limited.bootstrap) as busy:
        assert _metadata(idle) is not None
        for _ in range(6):                          # keep one talking past the idle limit
            assert _metadata(busy) is not None
            time.sleep(0.4)
        assert closed_by_peer(idle, timeout=10)
        assert _metadata(busy) is not None
    assert "connections_max_idle_ms" in _log(limited)


def test_half_sent_frame_is_dropped_after_the_request_timeout(limited):
    frame = request_bytes(3, 9, topics=None, allow_auto_topic_creation=False)
    with connect(limited.bootstrap) as stalled:
        stalled.sendall(frame[:len(frame) // 2])    # and then nothing
        _bystander_ok(limited)                     # meanwhile others are served
        assert closed_by_peer(stalled, timeout=10)
    wait.until(lambda: "a frame stopped arriving" in _log(limited), "a log line for the stalled frame")


def test_oversized_frame_closes_only_that_connection(limited):
    with connect(limited.bootstrap) as big:
        big.sendall(struct.pack(">i", 65537) + b"\0" * 100)
        assert closed_by_peer(big)
    _bystander_ok(limited)
    assert "frame size 65537 outside" in _log(limited)


@pytest.mark.parametrize("partitions,answered", [(50, True), (51, False)])
def test_partitions_per_request_capped(limited, partitions, answered):
    topics = [F.FetchTopic(topic="lim", partitions=[F.FetchTopic.FetchPartition(
        partition=i % 2, fetch_offset=0, partition_max_bytes=1024) for i in range(partitions)])]
    with connect(limited.bootstrap) as s:
        s.sendall(request_bytes(1, 4, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                                isolation_level=0, topics=topics))
        if answered:
            assert recv_frame(s) is not None
        else:
            assert closed_by_peer(s)
    if not answered:
        assert "max_partitions_per_request=50" in _log(limited)
    _bystander_ok(limited)


def test_max_connections_in_all(start_broker):
    b = start_broker("--max-connections", "2")
    first, second = _working_connection(b), _working_connection(b)
    try:
        third = connect(b.bootstrap)
        assert closed_by_peer(third)
        third.close()
        assert _metadata(first) is not None and _metadata(second) is not None
    finally:
        first.close()
        second.close()
    assert "max_connections=2 reached" in b.log_path.read_text()
    wait.until(lambda: _try_metadata(b), "a connection accepted again")


def test_limit_flags_must_be_numbers(tmp_path):
    out = subprocess.run([sys.executable, "-m", "semel", "broker", "start", "--data-dir", str(tmp_path),
                          "--max-connections", "-5"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "--max-connections must be" in out.stderr
    assert "Traceback" not in out.stderr
