"""Client: one connection to one broker, version negotiation, typed helpers."""
from __future__ import annotations

import select
import socket
import ssl
import struct
from dataclasses import dataclass
from typing import Any

from ..protocol.api_keys import ApiKey
from ..protocol.errors import KafkaError
from ..protocol.messages import decode_response, encode_request, request_class

# The highest versions this client speaks (kept modest: it needs no newer fields).
CLIENT_MAX = {
    ApiKey.PRODUCE: 9, ApiKey.FETCH: 12, ApiKey.LIST_OFFSETS: 7, ApiKey.METADATA: 12, ApiKey.OFFSET_COMMIT: 8,
    ApiKey.OFFSET_FETCH: 7, ApiKey.FIND_COORDINATOR: 3, ApiKey.API_VERSIONS: 3, ApiKey.CREATE_TOPICS: 7,
    ApiKey.DELETE_TOPICS: 6, ApiKey.INIT_PRODUCER_ID: 4, ApiKey.ADD_PARTITIONS_TO_TXN: 3, ApiKey.ADD_OFFSETS_TO_TXN: 3,
    ApiKey.END_TXN: 3, ApiKey.TXN_OFFSET_COMMIT: 3, ApiKey.DESCRIBE_CONFIGS: 4,
    # admin (semel.client.admin): groups, KIP-664 transaction tooling
    ApiKey.DESCRIBE_GROUPS: 5, ApiKey.LIST_GROUPS: 5, ApiKey.WRITE_TXN_MARKERS: 1, ApiKey.DELETE_GROUPS: 2,
    ApiKey.DESCRIBE_PRODUCERS: 0, ApiKey.DESCRIBE_TRANSACTIONS: 0, ApiKey.LIST_TRANSACTIONS: 2,
    ApiKey.CONSUMER_GROUP_HEARTBEAT: 1, ApiKey.CONSUMER_GROUP_DESCRIBE: 1, ApiKey.SHARE_GROUP_DESCRIBE: 1,
    ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: 1, ApiKey.ALTER_SHARE_GROUP_OFFSETS: 0,
    # topic admin (semel topic alter | delete-records | reassign)
    ApiKey.DELETE_RECORDS: 2, ApiKey.CREATE_PARTITIONS: 3, ApiKey.INCREMENTAL_ALTER_CONFIGS: 1,
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: 0, ApiKey.LIST_PARTITION_REASSIGNMENTS: 0,
    # SASL login (semel.client.sasl)
    ApiKey.SASL_HANDSHAKE: 1, ApiKey.SASL_AUTHENTICATE: 2,
}


class ClientError(Exception):
    def __init__(self, message: str, error: KafkaError | None = None):
        super().__init__(message)
        self.error = error


class ConnectionLost(ClientError):
    """The broker's end of the connection closed while an answer was awaited: the
    request may or may not have been carried out."""


# What a request on a connection that broke midway raises: reset, closed by the broker,
# or silent past the socket timeout. The request may or may not have been carried out.
CONNECTION_BROKEN = (OSError, ConnectionLost)


class TlsError(ClientError):
    """The TLS handshake failed: a setting to fix, not worth retrying."""


@dataclass
class FetchedPartition:
    error: KafkaError
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted: list[tuple[int, int]]
    records: bytes


class Client:
    """`ssl_context`: talk TLS (an SSL or SASL_SSL listener); the broker's certificate
    is checked against the context's CAs and the host name in `bootstrap`."""

    def __init__(self, bootstrap: str, client_id: str = "semel-cli", timeout_s: float = 30.0,
                 ssl_context: ssl.SSLContext | None = None):
        host, _, port = bootstrap.rpartition(":")
        if not host or not port.isdigit():
            raise ClientError(f"bootstrap must be HOST:PORT, got {bootstrap!r}")
        self.client_id = client_id
        try:
            self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        except OSError as exc:
            raise ClientError(f"cannot connect to {bootstrap}: {exc.strerror or exc}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl_context is not None:
            self.sock = _tls(self.sock, ssl_context, host, bootstrap)
        self._corr = 0
        self.versions: dict[int, int] = {}
        self._negotiate()

    def close(self) -> None:
        self.sock.close()

    def idle_open(self) -> bool:
        """For a connection kept idle between uses: False when the broker closed or reset
        it meanwhile (an idle connection that reads as ready holds an end of stream or an
        error, never an answer we wait for)."""
        try:
            ready, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not ready

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- wire -----------------------------------------------------------------

    def _negotiate(self) -> None:
        resp = self._call(ApiKey.API_VERSIONS, 0, request_class(ApiKey.API_VERSIONS)(version=0))
        if resp.error_code:
            raise ClientError("ApiVersions failed", KafkaError(resp.error_code))
        for k in resp.api_keys:
            if k.api_key in CLIENT_MAX:
                top = min(k.max_version, CLIENT_MAX[k.api_key])
                if top >= k.min_version:
                    self.versions[k.api_key] = top

    def version(self, api_key: int) -> int:
        if api_key not in self.versions:
            raise ClientError(f"broker does not support api key {api_key}")
        return self.versions[api_key]

    def request(self, api_key: int, expect_response: bool = True, **fields) -> Any:
        version = self.version(api_key)
        body = request_class(api_key)(version=version, **fields)
        return self._call(api_key, version, body, expect_response)

    def request_many(self, calls: list[tuple[int, dict]]) -> list[Any]:
        """Several requests in one write, their responses in order: one round trip.
        The broker handles a connection's requests one after another in the order
        sent (Kafka does too), so a later one sees what an earlier one did; each
        response says whether its request succeeded. A call may carry "_version"."""
        return self.receive_many(self.send_many(calls))

    def send_many(self, calls: list[tuple[int, dict]]) -> list[tuple[int, int, int]]:
        """The sending half of request_many: what receive_many needs to read the answers
        (a writer sends to several brokers before it waits for any)."""
        sent = []
        frames = []
        for api_key, fields in calls:
            fields = dict(fields)
            version = fields.pop("_version") if "_version" in fields else self.version(api_key)
            self._corr += 1
            frames.append(encode_request(api_key, version, self._corr,
                                         self.client_id, request_class(api_key)(version=version, **fields)))
            sent.append((api_key, version, self._corr))
        self.sock.sendall(b"".join(frames))
        return sent

    def receive_many(self, sent: list[tuple[int, int, int]]) -> list[Any]:
        return [self._response(*s) for s in sent]

    def _call(self, api_key: int, version: int, body, expect_response: bool = True) -> Any:
        self._corr += 1
        self.sock.sendall(encode_request(api_key, version, self._corr, self.client_id, body))
        if not expect_response:
            return None
        return self._response(api_key, version, self._corr)

    def _response(self, api_key: int, version: int, corr_sent: int) -> Any:
        size = struct.unpack(">i", self._recv(4))[0]
        corr, resp = decode_response(api_key, version, self._recv(size))
        if corr != corr_sent:
            raise ClientError(f"correlation id mismatch: sent {corr_sent}, got {corr}")
        return resp

    def _recv(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except ssl.SSLError as exc:   # an alert from the broker (TLS 1.3 sends a refused client cert's here)
                raise ClientError(f"TLS: the broker ended the session ({exc.reason or exc})") from None
            if not chunk:
                raise ConnectionLost("broker closed the connection" + self._why_closed())
            buf += chunk
        return bytes(buf)

    def _why_closed(self) -> str:
        if isinstance(self.sock, ssl.SSLSocket) and self._corr == 1:
            # TLS 1.3 checks the client's certificate after the handshake: a listener that
            # wants one closes the connection on the first request
            return " at the first request over TLS (does the listener want a client certificate?)"
        return ""

    # --- helpers ----------------------------------------------------------------

    def metadata(self, topics: list[str] | None = None):
        cls = request_class(ApiKey.METADATA)
        req_topics = None if topics is None else [cls.MetadataRequestTopic(name=t) for t in topics]
        return self.request(ApiKey.METADATA, topics=req_topics, allow_auto_topic_creation=False)

    def partitions(self, topic: str) -> int:
        md = self.metadata([topic])
        t = md.topics[0]
        if t.error_code:
            raise ClientError(f"topic {topic}: {KafkaError(t.error_code).name}", KafkaError(t.error_code))
        return len(t.partitions)

    def create_topic(self, name: str, partitions: int = 1, configs: dict[str, str] | None = None,
                     replication_factor: int = 1) -> KafkaError:
        cls = request_class(ApiKey.CREATE_TOPICS)
        T = cls.CreatableTopic
        topic = T(name=name, num_partitions=partitions, replication_factor=replication_factor, assignments=[],
                  configs=[T.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()])
        resp = self.request(ApiKey.CREATE_TOPICS, topics=[topic], timeout_ms=30000, validate_only=False)
        return KafkaError(resp.topics[0].error_code)

    def delete_topic(self, name: str) -> KafkaError:
        if self.version(ApiKey.DELETE_TOPICS) >= 6:
            cls = request_class(ApiKey.DELETE_TOPICS)
            resp = self.request(ApiKey.DELETE_TOPICS, topics=[cls.DeleteTopicState(name=name)], timeout_ms=30000)
        else:
            resp = self.request(ApiKey.DELETE_TOPICS, topic_names=[name], timeout_ms=30000)
        return KafkaError(resp.responses[0].error_code)

    def produce(self, topic: str, partition: int, batch: bytes, acks: int = -1,
                transactional_id: str | None = None) -> tuple[KafkaError, int]:
        cls = request_class(ApiKey.PRODUCE)
        T = cls.TopicProduceData
        resp = self.request(ApiKey.PRODUCE, expect_response=acks != 0, transactional_id=transactional_id, acks=acks,
                            timeout_ms=30000,
                            topic_data=[T(name=topic, partition_data=[T.PartitionProduceData(
                                index=partition, records=batch)])])
        if resp is None:
            return KafkaError.NONE, -1
        p = resp.responses[0].partition_responses[0]
        return KafkaError(p.error_code), p.base_offset

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = 1 << 20,
              isolation: int = 0, max_wait_ms: int = 0, min_bytes: int = 1) -> FetchedPartition:
        cls = request_class(ApiKey.FETCH)
        T = cls.FetchTopic
        resp = self.request(ApiKey.FETCH, replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                            max_bytes=max_bytes, isolation_level=isolation, session_id=0,
                            session_epoch=-1, topics=[T(topic=topic, partitions=[T.FetchPartition(
                                partition=partition, current_leader_epoch=-1, fetch_offset=offset,
                                last_fetched_epoch=-1, log_start_offset=-1,
                                partition_max_bytes=max_bytes)])],
                            forgotten_topics_data=[], rack_id="")
        p = resp.responses[0].partitions[0]
        aborted = [(a.producer_id, a.first_offset) for a in (p.aborted_transactions or [])]
        return FetchedPartition(KafkaError(p.error_code), p.high_watermark, p.last_stable_offset,
                                p.log_start_offset, aborted, p.records or b"")

    def list_offset(self, topic: str, partition: int, timestamp: int, isolation: int = 0) -> int:
        cls = request_class(ApiKey.LIST_OFFSETS)
        T = cls.ListOffsetsTopic
        resp = self.request(ApiKey.LIST_OFFSETS, replica_id=-1, isolation_level=isolation, topics=[T(
            name=topic, partitions=[T.ListOffsetsPartition(partition_index=partition,
                                                            current_leader_epoch=-1, timestamp=timestamp)])])
        p = resp.topics[0].partitions[0]
        if p.error_code:
            raise ClientError(f"ListOffsets {topic}-{partition}: {KafkaError(p.error_code).name}",
                              KafkaError(p.error_code))
        return p.offset


__all__ = ["Client", "ClientError", "FetchedPartition", "TlsError"]


def _tls(sock: socket.socket, context: ssl.SSLContext, host: str, bootstrap: str) -> ssl.SSLSocket:
    """The TLS handshake; a failure is one line saying what to check."""
    try:
        return context.wrap_socket(sock, server_hostname=host)
    except ssl.SSLCertVerificationError as exc:
        sock.close()
        raise TlsError(f"TLS to {bootstrap}: the broker's certificate was not accepted ({exc.verify_message}); "
                          f"check the CA file and that the certificate names {host}") from None
    except (ssl.SSLError, OSError) as exc:
        sock.close()
        reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
        raise TlsError(f"TLS handshake with {bootstrap} failed: {reason} (is it a TLS listener? does it want "
                          f"a client certificate?)") from None

