"""Error codes a newer broker may send that the code table lacks.

The client half runs against a socket server that answers with semel's own
response encoder, standing in for a broker newer than this table: no real
broker available to the tests sends codes above 115.
"""
from __future__ import annotations

import pickle
import socket
import struct
import threading

import pytest

from semel.client.client import Client, ClientError
from semel.protocol.errors import KafkaError
from semel.protocol.messages import encode_response, peek_header, response_class


@pytest.mark.parametrize("code", [116, 9999, 61])
def test_unknown_code_is_a_value_not_a_crash(code):
    err = KafkaError(code)
    assert isinstance(err, KafkaError)
    assert int(err) == code
    assert err.name == f"UNKNOWN_ERROR_{code}"
    assert not err.retriable
    assert KafkaError(code) is err
    assert pickle.loads(pickle.dumps(err)) is err


def test_known_codes_and_the_member_list_are_unchanged():
    assert KafkaError(51) is KafkaError.CONCURRENT_TRANSACTIONS
    assert KafkaError(51).retriable
    KafkaError(116)
    assert all(not m.name.startswith("UNKNOWN_ERROR_") for m in KafkaError)
    with pytest.raises(ValueError):
        KafkaError("51")


class _NewerBroker:
    """Answers ApiVersions (Metadata v0..12), then every Metadata with `code` on the topic."""

    def __init__(self, code: int):
        self.code = code
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            while True:
                head = conn.recv(4, socket.MSG_WAITALL)
                if len(head) < 4:
                    return
                frame = conn.recv(struct.unpack(">i", head)[0], socket.MSG_WAITALL)
                api_key, version, corr = peek_header(frame)
                conn.sendall(encode_response(api_key, version, corr, self._body(api_key, version)))

    def _body(self, api_key: int, version: int):
        cls = response_class(api_key)
        if api_key == 18:
            return cls(error_code=0, api_keys=[cls.ApiVersion(api_key=18, min_version=0, max_version=3),
                                                cls.ApiVersion(api_key=3, min_version=0, max_version=12)])
        return cls(brokers=[], topics=[cls.MetadataResponseTopic(
            error_code=self.code, name="t", partitions=[], is_internal=False)])


@pytest.mark.parametrize("code", [116, 9999])
def test_client_reports_a_newer_brokers_error(code):
    broker = _NewerBroker(code)
    with Client(f"127.0.0.1:{broker.port}", timeout_s=10) as client:
        with pytest.raises(ClientError) as info:
            client.partitions("t")
    assert info.value.error == code
    assert f"UNKNOWN_ERROR_{code}" in str(info.value)
