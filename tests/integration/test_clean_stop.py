"""A SIGTERM stop is clean: the broker exits 0 and its log holds no ERROR and no traceback,
also when connections are mid-request as it stops."""
from __future__ import annotations

import socket
import time

from semel.client import Client
from semel.protocol import records
from semel.protocol.api_keys import ApiKey
from semel.protocol.errors import KafkaError
from semel.protocol.messages import encode_request, request_class

TOPIC = "stop"


def _fetch_frame(client: Client, correlation_id: int) -> bytes:
    version = client.version(ApiKey.FETCH)
    cls = request_class(ApiKey.FETCH)
    T = cls.FetchTopic
    body = cls(version=version, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
               session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
               topics=[T(topic=TOPIC, partitions=[T.FetchPartition(
                   partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                   log_start_offset=-1, partition_max_bytes=1 << 20)])])
    return encode_request(ApiKey.FETCH, version, correlation_id, "stopper", body)


def test_sigterm_with_answers_still_being_written_logs_no_error(broker):
    with Client(broker.bootstrap) as client:
        assert client.create_topic(TOPIC, 1) == KafkaError.NONE
        for _ in range(8):
            err, _ = client.produce(TOPIC, 0, records.build_batch([(None, b"v" * (512 * 1024))]))
            assert err == KafkaError.NONE
        frames = b"".join(_fetch_frame(client, i) for i in range(24))
    # A client that asks for 24 MiB (fewer answers than the broker queues), reads none of it and closes its sending side: the
    # broker has stopped reading that connection and is still writing its answers when
    # SIGTERM comes.
    stuck = socket.create_connection((broker.host, broker.port))
    stuck.sendall(frames)
    time.sleep(1.0)
    stuck.shutdown(socket.SHUT_WR)
    idle = socket.create_connection((broker.host, broker.port))
    time.sleep(0.5)
    try:
        assert broker.stop() == 0
    finally:
        stuck.close()
        idle.close()
    text = broker.log_path.read_text()
    assert "semel broker stopped" in text
    assert "ERROR" not in text and "Traceback" not in text, text
