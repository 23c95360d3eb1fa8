"""One client must not freeze the broker for the others.

A Fetch with no partitions and a 24-day max_wait_ms must not hold the event loop
until its deadline (nobody else answered, no connection accepted): Kafka answers
such a fetch at once. These tests send it (and a legitimate fetch parked on a partition
with no data) while a second client produces and consumes, and read the watchdog's
loop-lag metric from the Prometheus endpoint.
"""
from __future__ import annotations

import time
import urllib.request

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from semel.client import Client
from semel.launch.process import free_port
from semel.protocol.messages import request_class
from tests.support.brokers import module_broker
from tests.support.wire import connect, recv_frame, request_bytes

F = request_class(1)
NEVER = 2**31 - 1
# Generous: a loaded 2-core machine answers a produce in milliseconds; a frozen
# broker does not answer for max_wait_ms (seconds to days).
ANSWER_BOUND_S = 2.0


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    port = free_port()
    with module_broker(tmp_path_factory, "freeze", "--metrics-port", str(port)) as b:
        b.metrics_url = f"http://127.0.0.1:{port}/metrics"
        with Client(b.bootstrap) as c:
            for topic in ("quiet", "busy"):
                c.create_topic(topic, 1)
        yield b


def _fetch(topics, max_wait_ms=NEVER, min_bytes=1, version=4):
    return request_bytes(1, version, corr=7, replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                         max_bytes=1 << 20, isolation_level=0, topics=topics)


def _parked(topic: str) -> list:
    return [F.FetchTopic(topic=topic, partitions=[F.FetchTopic.FetchPartition(
        partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])]


def _scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _bystander_round_trips(bootstrap: str, n: int) -> list[float]:
    """Seconds each produce (acks=all) and each consume took for a well-behaved client."""
    took = []
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0})
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bystander", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 50})
    c.assign([TopicPartition("busy", 0, 0)])
    try:
        got = 0
        for i in range(n):
            t0 = time.monotonic()
            p.produce("busy", value=b"v%d" % i)
            assert p.flush(30) == 0
            took.append(time.monotonic() - t0)
            t0 = time.monotonic()
            while got <= i:
                m = c.poll(0.1)
                if m is not None and not m.error():
                    got += 1
                assert time.monotonic() - t0 < 30, "the bystander's record never came back"
            took.append(time.monotonic() - t0)
    finally:
        c.close()
    return took


def test_empty_fetch_with_a_huge_wait_is_answered_at_once_and_nobody_waits(served):
    with connect(served.bootstrap, timeout=10) as bad, connect(served.bootstrap, timeout=10) as parked:
        # A fetch parked on a partition that never gets data: legitimately outstanding for days.
        parked.sendall(_fetch(_parked("quiet"), min_bytes=1))
        for version in (4, 12):
            bad.sendall(_fetch([], version=version))
            frame = recv_frame(bad)          # Kafka answers a fetch with no partitions at once
            assert frame is not None, f"no answer to an empty Fetch v{version}"
        # Nothing to wait on once every partition is in error: answered too.
        bad.sendall(_fetch(_parked("no-such-topic")))
        assert recv_frame(bad) is not None
        took = _bystander_round_trips(served.bootstrap, 20)
        assert max(took) < ANSWER_BOUND_S, took
        # The parked fetch is still outstanding and the connection usable: a new record wakes it.
        p = Producer({"bootstrap.servers": served.bootstrap})
        p.produce("quiet", value=b"wake")
        assert p.flush(30) == 0
        assert recv_frame(parked) is not None


def test_loop_lag_is_on_the_metrics_endpoint(served):
    with connect(served.bootstrap) as s:
        s.sendall(_fetch([]))
        assert recv_frame(s) is not None
    time.sleep(0.5)   # a few watchdog samples (every 100 ms)
    m = _scrape(served.metrics_url)
    assert m["semel_event_loop_lag_seconds_count"] > 0
    assert m['semel_event_loop_lag_seconds_bucket{le="+Inf"}'] == m["semel_event_loop_lag_seconds_count"]
    assert 0 <= m["semel_event_loop_lag_max_seconds"] < ANSWER_BOUND_S


def test_a_stopped_process_is_not_taken_for_a_held_loop(served):
    """Chaos tests SIGSTOP brokers: the lag that follows is logged as 'not running',
    without the stall marker that fails the suite."""
    from semel.broker.watchdog import STALL_MARKER
    from tests.support import wait
    served.pause()
    time.sleep(2.5)
    served.resume()
    wait.until(lambda: "not running" in served.log_path.read_text(), "the pause seen by the watchdog")
    assert STALL_MARKER not in served.log_path.read_text()
    assert _bystander_round_trips(served.bootstrap, 1)


def test_a_huge_request_is_refused_without_holding_the_loop(served):
    """A 19 MB Fetch naming 1.2 million partitions (under the default 100 MiB frame
    limit) takes seconds to decode: done off the loop, then refused by the
    partitions-per-request cap, while another client goes on."""
    import struct
    import threading
    from tests.support.wire import closed_by_peer
    n = 1_200_000
    topic = b"quiet"
    body = struct.pack(">iiiib", -1, 0, 1, 1 << 20, 0) + struct.pack(">i", 1) \
        + struct.pack(">h", len(topic)) + topic + struct.pack(">i", n) + struct.pack(">iqi", 0, 0, 1024) * n
    head = struct.pack(">hhih", 1, 4, 99, 4) + b"huge"
    frame = struct.pack(">i", len(head) + len(body)) + head + body
    with connect(served.bootstrap, timeout=60) as s:
        sender = threading.Thread(target=s.sendall, args=(frame,))
        sender.start()
        took = _bystander_round_trips(served.bootstrap, 10)
        sender.join(60)
        assert closed_by_peer(s, timeout=60)
    assert max(took) < ANSWER_BOUND_S, took
    assert "max_partitions_per_request=10000" in served.log_path.read_text()
