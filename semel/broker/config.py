"""Broker configuration: one dataclass, defaults close to Kafka's where they matter."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..cluster.keys import DEFAULT_CLUSTER_ID
from ..storage.log_config import LogConfig


@dataclass
class BrokerConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 9092
    advertised_host: str | None = None
    node_id: int = 0
    cluster_id: str = DEFAULT_CLUSTER_ID
    # Requests larger than this close the connection (Kafka: socket.request.max.bytes).
    max_request_bytes: int = 100 * 1024 * 1024
    # A single produce payload per partition larger than this: MESSAGE_TOO_LARGE.
    max_message_bytes: int = 8 * 1024 * 1024
    # Largest Fetch response (the first partition may still exceed it by one batch).
    max_fetch_response_bytes: int = 4 * 1024 * 1024
    auto_create_topics: bool = False
    default_partitions: int = 1
    log: LogConfig = field(default_factory=LogConfig)
    retention_check_interval_ms: int = 60_000
    # Consumer groups
    group_initial_rebalance_delay_ms: int = 300
    group_min_session_timeout_ms: int = 6_000
    group_max_session_timeout_ms: int = 1_800_000
    # The consumer protocol (KIP-848): Kafka's group.consumer.heartbeat.interval.ms and
    # group.consumer.session.timeout.ms, told to members by the broker.
    group_consumer_heartbeat_interval_ms: int = 5_000
    group_consumer_session_timeout_ms: int = 45_000
    # group.consumer.migration.policy: online upgrade/downgrade between the protocols.
    group_consumer_migration_policy: str = "bidirectional"
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    offsets_log_compact_records: int = 50_000
    offsets_log_segment_bytes: int = 8 * 1024 * 1024
    # Transactions
    transaction_max_timeout_ms: int = 900_000
    transactional_id_expiration_ms: int = 7 * 24 * 3600 * 1000
    # (idle idempotent producers expire per partition: log.producer_id_expiration_ms,
    #  checked with retention every retention_check_interval_ms)
    transaction_abort_check_interval_ms: int = 1_000
    # Coordinator log compaction: rewrite live state once this many records piled up
    # (or 4x the live ids), in segments of this size so old ones can be dropped.
    transaction_log_compact_records: int = 50_000
    transaction_log_segment_bytes: int = 8 * 1024 * 1024
    metrics_port: int | None = None
    # --- limits on what one client can take (docs/operations.md) ---
    # Kafka's max.connections and max.connections.per.ip (both unlimited there by
    # default; over the limit the new connection is closed at once).
    max_connections: int = 2**31 - 1
    max_connections_per_ip: int = 2**31 - 1
    # Kafka's connections.max.idle.ms: a connection with no request for this long is closed.
    connections_max_idle_ms: int = 600_000
    # A frame whose bytes stop arriving half-way is dropped after this (Kafka's request.timeout.ms).
    request_timeout_ms: int = 30_000
    # Partitions one request may name (Produce, Fetch, ListOffsets, ...): more is INVALID_REQUEST
    # (or the connection closed for APIs without a per-partition error). Bounds the CPU one
    # request takes; far above what any client sends.
    max_partitions_per_request: int = 10_000
    # Where the broker decompresses a batch (compacted topics read every key), its
    # records may expand to at most this; more is MESSAGE_TOO_LARGE, refused before
    # the memory is taken (a 1 MiB batch of zeros can expand to gigabytes).
    max_decompressed_batch_bytes: int = 32 * 1024 * 1024
    # Event loop watchdog: log the holder past warn, log STALL_MARKER past stall.
    loop_lag_warn_ms: int = 200
    loop_stall_ms: int = 2_000

    # --- security (docs/security.md) ---
    # Security protocol of the listener at host:port: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
    security_protocol: str = "PLAINTEXT"
    # More listeners, Kafka's "NAME://HOST:PORT"; a listener's protocol comes from
    # listener_security_protocol_map (NAME -> protocol) or is the name itself.
    listeners: list[str] = field(default_factory=list)
    listener_security_protocol_map: dict[str, str] = field(default_factory=dict)
    ssl_certfile: str | None = None     # PEM certificate chain for SSL / SASL_SSL listeners
    ssl_keyfile: str | None = None
    # Kafka's ssl.client.auth: "none", "requested" or "required" (mTLS). A client's
    # certificate is checked against ssl_cafile; on an SSL listener its subject is the
    # principal ("User:CN=alice,OU=payments", RFC 2253 order, as Kafka names it).
    ssl_client_auth: str = "none"
    ssl_cafile: str | None = None
    sasl_enabled_mechanisms: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
    # Principals ("User:admin") that every ACL check lets through (Kafka's super.users).
    super_users: set[str] = field(default_factory=set)
    # ACL checks run when any listener authenticates (None) or as set here.
    authorizer_enabled: bool | None = None
    # Kafka's allow.everyone.if.no.acl.found: off, so a resource nobody granted is closed.
    allow_everyone_if_no_acl_found: bool = False
    # Kafka's connections.max.reauth.ms (KIP-368): a SASL login lasts this long (less when
    # an OAUTHBEARER token expires sooner); the client logs in again on the connection
    # in time or the connection is closed at its next request. 0: logins never expire.
    # Per listener: listener_connections_max_reauth_ms[NAME] (Kafka's listener.name. prefix).
    connections_max_reauth_ms: int = 0
    listener_connections_max_reauth_ms: dict[str, int] = field(default_factory=dict)
    # OAUTHBEARER's unsecured token validator (Kafka's unsecuredValidator* options).
    # None: 0 for unsecured tokens, 30 s for signed ones (Kafka's defaults of each).
    sasl_oauthbearer_clock_skew_ms: int | None = None
    sasl_oauthbearer_required_scope: tuple[str, ...] = ()
    sasl_oauthbearer_principal_claim: str = "sub"
    sasl_oauthbearer_scope_claim: str = "scope"
    # Signed tokens (Kafka's KIP-768 validator; semel.broker.auth.oauth_jwks) when a JWKS
    # source is set: a file path or an http(s) URL (sasl.oauthbearer.jwks.endpoint.url).
    # Unsecured tokens are then refused.
    sasl_oauthbearer_jwks: str | None = None
    sasl_oauthbearer_expected_audience: tuple[str, ...] = ()
    sasl_oauthbearer_expected_issuer: str | None = None
    sasl_oauthbearer_jwks_refresh_ms: int = 3_600_000
    sasl_oauthbearer_jwks_retry_backoff_ms: int = 100
    sasl_oauthbearer_jwks_retry_backoff_max_ms: int = 10_000
    # An unknown kid fetches the JWKS again at most once per this long.
    sasl_oauthbearer_jwks_unknown_kid_refresh_ms: int = 10_000

    # --- cluster (docs/cluster.md) ---
    # etcd endpoints ("host:port,host:port"); None = the embedded single node, no cluster.
    metadata_endpoints: str | None = None
    # This broker's session in etcd lasts this long without a refresh: a killed broker's
    # partitions get new leaders after about this long.
    cluster_lease_ttl_s: int = 6
    # Replication factor of a topic created with -1 (Kafka's default.replication.factor).
    default_replication_factor: int = 1
    # Partitions of __transaction_state / __consumer_offsets when this broker creates
    # them (Kafka's transaction.state.log.num.partitions / offsets.topic.num.partitions,
    # 50 there). Every broker of a cluster must use the same count: an id's coordinator
    # is its partition's leader. 6 spreads two coordinator partitions of each kind per
    # broker over a 3-broker cluster (so a dead broker's share moves to both others)
    # while keeping the replicas, fetch entries and loads a small box runs few.
    transaction_state_partitions: int = 6
    offsets_topic_partitions: int = 6

    # --- replication (semel.cluster.replica_manager, read by broker.node_role.replica_settings) ---
    # acks=all needs this many in-sync replicas (topic config min.insync.replicas overrides).
    min_insync_replicas: int = 1
    # A follower not caught up for this long leaves the ISR (Kafka's replica.lag.time.max.ms).
    replica_lag_time_max_ms: int = 30_000
    # A follower's fetch waits at most this long for new data (replica.fetch.wait.max.ms).
    replica_fetch_wait_max_ms: int = 500
    # Per partition per follower fetch (replica.fetch.max.bytes).
    replica_fetch_max_bytes: int = 1024 * 1024
    # A follower writes fetched batches of at least this many bytes in a worker thread
    # (its event loop stays free meanwhile), smaller ones on the loop, where a thread
    # hop costs more than the copy (semel.storage.write_offload.OFFLOOP_WRITE_BYTES, 64 KiB).
    replica_write_thread_bytes: int = 64 * 1024

    # Kafka's leader balance (semel.cluster.controller): the controller moves leadership
    # back to preferred replicas every check interval where a broker's share of partitions
    # led elsewhere is above the percentage.
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_per_broker_percentage: int = 10
    leader_imbalance_check_interval_seconds: int = 300

    # Controlled shutdown (semel.cluster.shutdown): how long a stopping broker of a
    # cluster waits to hand its leaderships and coordinators to in-sync peers.
    controlled_shutdown_timeout_ms: int = 30_000

    # --- between brokers (docs/security.md "Between brokers") ---
    # Kafka's inter.broker.listener.name: the listener of every broker that the others
    # connect to (follower fetches, transaction markers); None = the --host/--port one.
    inter_broker_listener_name: str | None = None
    # Kafka's sasl.mechanism.inter.broker.protocol; None = the strongest enabled mechanism.
    inter_broker_sasl_mechanism: str | None = None
    # The login brokers use on a SASL inter-broker listener (a super user, or one granted
    # ClusterAction on the cluster). The password never goes on a command line.
    inter_broker_user: str | None = None
    inter_broker_password: str | None = field(default=None, repr=False)

    def all_listeners(self) -> list["Listener"]:
        """The host:port listener first, then `listeners` (ValueError on a bad entry)."""
        out = [Listener(DEFAULT_LISTENER, self.host, self.port, _protocol(self.security_protocol))]
        for spec in self.listeners:
            name, sep, rest = spec.partition("://")
            host, colon, port = rest.rpartition(":")
            if not sep or not colon or not port.isdigit():
                raise ValueError(f"listener {spec!r} is not NAME://HOST:PORT")
            out.append(Listener(name, host, int(port),
                                _protocol(self.listener_security_protocol_map.get(name, name))))
        return out

    def inter_broker_listener(self) -> "Listener":
        """The listener peers reach this broker on (ValueError when it names none)."""
        name = self.inter_broker_listener_name or DEFAULT_LISTENER
        listeners = self.all_listeners()
        for lst in listeners:
            if lst.name == name:
                return lst
        raise ValueError(f"inter-broker listener {name!r} is none of this broker's listeners "
                         f"({', '.join(lst.name for lst in listeners)})")

    def max_reauth_ms(self, listener_name: str) -> int:
        """connections.max.reauth.ms of a listener (its own setting, else the broker's)."""
        return self.listener_connections_max_reauth_ms.get(listener_name, self.connections_max_reauth_ms)

    @property
    def authenticating(self) -> bool:
        """SASL on some listener, or client certificates on a TLS one (ACL checks follow)."""
        mtls = self.ssl_client_auth != "none"
        return any(lst.sasl or (mtls and lst.tls) for lst in self.all_listeners())

    @property
    def advertised(self) -> str:
        return self.advertised_host or self.host


# The name of the --host/--port listener (the others are named by --listener NAME://...).
DEFAULT_LISTENER = "DEFAULT"
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


@dataclass
class Listener:
    name: str
    host: str
    port: int
    protocol: str

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")


def _protocol(name: str) -> str:
    proto = name.upper()
    if proto not in SECURITY_PROTOCOLS:
        raise ValueError(f"unknown security protocol {name!r} (one of {', '.join(SECURITY_PROTOCOLS)})")
    return proto
