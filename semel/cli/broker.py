"""`semel broker start`: run a broker in the foreground until SIGTERM/SIGINT."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from ..cluster.keys import DEFAULT_CLUSTER_ID
from .main import CliError


def add_parser(sub) -> None:
    p = sub.add_parser("broker", help="run a broker")
    bsub = p.add_subparsers(dest="action", metavar="ACTION")
    bsub.required = True
    s = bsub.add_parser("start", help="start a broker in the foreground (SIGTERM/SIGINT stops it cleanly)")
    s.add_argument("--data-dir", required=True, type=Path, help="directory for logs and coordinator state")
    s.add_argument("--port", type=int, default=9092, help="listen port (0 picks a free one)")
    s.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    s.add_argument("--advertised-host", default=None, help="host name clients should use")
    s.add_argument("--auto-create-topics", action="store_true", help="create unknown topics on first use")
    s.add_argument("--default-partitions", type=int, default=1)
    s.add_argument("--flush-mode", choices=["always", "interval", "never"], default="always",
                   help="always: acks=all waits for fsync (group commit); interval: fsync every "
                        "--flush-interval-ms; never: leave it to the OS")
    s.add_argument("--flush-interval-ms", type=int, default=1000)
    s.add_argument("--segment-bytes", type=int, default=None)
    s.add_argument("--retention-ms", type=int, default=None)
    s.add_argument("--retention-bytes", type=int, default=None)
    s.add_argument("--max-request-bytes", type=int, default=None)
    s.add_argument("--group-min-session-timeout-ms", type=int, default=None)
    s.add_argument("--group-consumer-heartbeat-interval-ms", type=int, default=None,
                   help="consumer protocol (KIP-848): heartbeat interval told to members (default 5000)")
    s.add_argument("--group-consumer-session-timeout-ms", type=int, default=None,
                   help="consumer protocol (KIP-848): a member silent this long is fenced (default 45000)")
    s.add_argument("--group-consumer-migration-policy", default="bidirectional",
                   choices=["bidirectional", "upgrade", "downgrade", "disabled"],
                   help="online migration of a group between the classic and the consumer protocol "
                        "(Kafka's group.consumer.migration.policy; default bidirectional)")
    s.add_argument("--group-initial-rebalance-delay-ms", type=int, default=None)
    s.add_argument("--transaction-max-timeout-ms", type=int, default=None)
    s.add_argument("--transaction-abort-check-interval-ms", type=int, default=None)
    s.add_argument("--transactional-id-expiration-ms", type=int, default=None)
    s.add_argument("--producer-id-expiration-ms", type=int, default=None,
                   help="forget idle idempotent producers after this long (default 7 days)")
    s.add_argument("--retention-check-interval-ms", type=int, default=None,
                   help="how often retention and producer expiry run (default 60000)")
    s.add_argument("--transaction-log-compact-records", type=int, default=None,
                   help="rewrite the transaction log's live state after this many records (default 50000)")
    s.add_argument("--transaction-log-segment-bytes", type=int, default=None,
                   help="segment size of the transaction log, set when it is created (default 8 MiB)")
    s.add_argument("--offsets-log-compact-records", type=int, default=None,
                   help="rewrite the live committed offsets after this many records (default 50000)")
    s.add_argument("--offsets-log-segment-bytes", type=int, default=None,
                   help="segment size of __consumer_offsets, set when it is created (default 8 MiB)")
    s.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port")
    s.add_argument("--max-connections", type=int, default=None, help="open connections in all (default unlimited)")
    s.add_argument("--max-connections-per-ip", type=int, default=None,
                   help="open connections from one address (default unlimited)")
    s.add_argument("--connections-max-idle-ms", type=int, default=None,
                   help="close a connection that sent nothing for this long (default 600000)")
    s.add_argument("--request-timeout-ms", type=int, default=None,
                   help="drop a connection whose request stopped arriving half-way after this (default 30000)")
    s.add_argument("--max-partitions-per-request", type=int, default=None,
                   help="close a connection whose request names more partitions (default 10000)")
    s.add_argument("--max-decompressed-batch-bytes", type=int, default=None,
                   help="refuse a batch whose records expand past this where the broker decompresses "
                        "(compacted topics; default 33554432)")
    s.add_argument("--loop-lag-warn-ms", type=int, default=None,
                   help="log the request that held the event loop longer than this (default 200)")
    s.add_argument("--loop-stall-ms", type=int, default=None,
                   help="log an event-loop stall (error) past this (default 2000)")
    _security_args(s)
    _cluster_args(s)
    s.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    s.set_defaults(func=run)


# CLI flag -> (config object path) for the optional numeric overrides.
_OVERRIDES = {
    "segment_bytes": "log.segment_bytes",
    "retention_ms": "log.retention_ms",
    "retention_bytes": "log.retention_bytes",
    "max_request_bytes": "max_request_bytes",
    "group_min_session_timeout_ms": "group_min_session_timeout_ms",
    "group_initial_rebalance_delay_ms": "group_initial_rebalance_delay_ms",
    "group_consumer_heartbeat_interval_ms": "group_consumer_heartbeat_interval_ms",
    "group_consumer_session_timeout_ms": "group_consumer_session_timeout_ms",
    "transaction_max_timeout_ms": "transaction_max_timeout_ms",
    "transaction_abort_check_interval_ms": "transaction_abort_check_interval_ms",
    "transactional_id_expiration_ms": "transactional_id_expiration_ms",
    "producer_id_expiration_ms": "log.producer_id_expiration_ms",
    "retention_check_interval_ms": "retention_check_interval_ms",
    "transaction_log_compact_records": "transaction_log_compact_records",
    "transaction_log_segment_bytes": "transaction_log_segment_bytes",
    "offsets_log_compact_records": "offsets_log_compact_records",
    "offsets_log_segment_bytes": "offsets_log_segment_bytes",
    "max_connections": "max_connections",
    "max_connections_per_ip": "max_connections_per_ip",
    "connections_max_idle_ms": "connections_max_idle_ms",
    "request_timeout_ms": "request_timeout_ms",
    "max_partitions_per_request": "max_partitions_per_request",
    "max_decompressed_batch_bytes": "max_decompressed_batch_bytes",
    "loop_lag_warn_ms": "loop_lag_warn_ms",
    "loop_stall_ms": "loop_stall_ms",
    "min_insync_replicas": "min_insync_replicas",
    "replica_lag_time_max_ms": "replica_lag_time_max_ms",
    "replica_fetch_wait_max_ms": "replica_fetch_wait_max_ms",
    "replica_fetch_max_bytes": "replica_fetch_max_bytes",
    "replica_write_thread_bytes": "replica_write_thread_bytes",
    "transaction_state_partitions": "transaction_state_partitions",
    "offsets_topic_partitions": "offsets_topic_partitions",
    "leader_imbalance_per_broker_percentage": "leader_imbalance_per_broker_percentage",
    "leader_imbalance_check_interval_seconds": "leader_imbalance_check_interval_seconds",
    "controlled_shutdown_timeout_ms": "controlled_shutdown_timeout_ms",
}


def _cluster_args(s) -> None:
    """A broker of a cluster (docs/cluster.md); without --metadata it is the single node."""
    g = s.add_argument_group("cluster")
    g.add_argument("--node-id", type=int, default=0, help="this broker's id in the cluster (default 0)")
    g.add_argument("--metadata", default=None, metavar="ENDPOINTS",
                   help="etcd endpoints, HOST:PORT[,HOST:PORT...]: join that cluster")
    g.add_argument("--cluster-id", default=DEFAULT_CLUSTER_ID, help="cluster name (keys under /semel/<id>/ in etcd)")
    g.add_argument("--lease-ttl-s", type=int, default=6,
                   help="session length: a dead broker's partitions move after about this long (default 6)")
    g.add_argument("--default-replication-factor", type=int, default=1,
                   help="replication factor of topics created with -1 (default 1)")
    g.add_argument("--transaction-state-partitions", type=int, default=None,
                   help="partitions of __transaction_state when this broker creates it; the same on "
                        "every broker (Kafka's transaction.state.log.num.partitions; default 6)")
    g.add_argument("--offsets-topic-partitions", type=int, default=None,
                   help="partitions of __consumer_offsets when this broker creates it; the same on "
                        "every broker (Kafka's offsets.topic.num.partitions; default 6)")
    g.add_argument("--auto-leader-rebalance-enable", choices=["true", "false"], default="true",
                   help="move leadership back to preferred replicas when a broker's share of partitions "
                        "led elsewhere passes --leader-imbalance-per-broker-percentage (default true)")
    g.add_argument("--leader-imbalance-per-broker-percentage", type=int, default=None,
                   help="imbalance a broker may have before its leaders move back (default 10)")
    g.add_argument("--leader-imbalance-check-interval-seconds", type=int, default=None,
                   help="how often the controller checks leader balance (default 300)")
    g.add_argument("--controlled-shutdown-timeout-ms", type=int, default=None,
                   help="on SIGTERM, how long to wait handing leaderships and coordinators to in-sync "
                        "peers before stopping (default 30000)")
    g.add_argument("--min-insync-replicas", type=int, default=None,
                   help="acks=all needs this many in-sync replicas unless the topic says (default 1)")
    g.add_argument("--replica-lag-time-max-ms", type=int, default=None,
                   help="a follower not caught up this long leaves the ISR (default 30000)")
    g.add_argument("--replica-fetch-wait-max-ms", type=int, default=None,
                   help="longest wait of a follower's fetch for new data (default 500)")
    g.add_argument("--replica-fetch-max-bytes", type=int, default=None,
                   help="most bytes a follower's fetch asks of each partition (default 1048576); "
                        "larger fetches mean fewer round trips and pwrites per MB replicated")
    g.add_argument("--replica-write-thread-bytes", type=int, default=None,
                   help="a follower writes fetched data of at least this size in a worker thread, "
                        "smaller on its event loop (default 65536)")


def _apply_cluster(cfg, args) -> None:
    if args.node_id < 0:
        raise CliError(f"--node-id must be 0 or more, got {args.node_id}")
    cfg.node_id, cfg.cluster_id = args.node_id, args.cluster_id
    if args.metadata is None:
        return
    from .optional import require
    require("aiohttp", "--metadata (a broker in a cluster)")
    from ..cluster.etcd import parse_endpoints
    try:
        parse_endpoints(args.metadata)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.lease_ttl_s < 2:
        raise CliError("--lease-ttl-s must be at least 2")
    if args.default_replication_factor < 1:
        raise CliError("--default-replication-factor must be at least 1")
    for name in ("transaction_state_partitions", "offsets_topic_partitions"):
        if getattr(cfg, name) < 1:
            raise CliError(f"--{name.replace('_', '-')} must be at least 1")
    cfg.metadata_endpoints = args.metadata
    cfg.cluster_lease_ttl_s = args.lease_ttl_s
    cfg.default_replication_factor = args.default_replication_factor
    cfg.auto_leader_rebalance_enable = args.auto_leader_rebalance_enable == "true"
    if cfg.leader_imbalance_check_interval_seconds < 1:
        raise CliError("--leader-imbalance-check-interval-seconds must be at least 1")
    _check_inter_broker(cfg)


def _security_args(s) -> None:
    """Kafka's listener and authorizer settings (docs/security.md)."""
    g = s.add_argument_group("security")
    g.add_argument("--security-protocol", default="PLAINTEXT",
                   help="protocol of the --host/--port listener: PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL")
    g.add_argument("--listener", action="append", default=[], metavar="NAME://HOST:PORT",
                   help="another listener (repeatable); its protocol is NAME or --listener-protocol NAME=PROTO")
    g.add_argument("--listener-protocol", action="append", default=[], metavar="NAME=PROTOCOL",
                   help="Kafka's listener.security.protocol.map, one entry per flag")
    g.add_argument("--ssl-certfile", default=None, help="PEM certificate (chain) for SSL listeners")
    g.add_argument("--ssl-keyfile", default=None, help="PEM private key for SSL listeners")
    g.add_argument("--ssl-client-auth", choices=["none", "requested", "required"], default="none",
                   help="client certificates on TLS listeners (Kafka's ssl.client.auth); an SSL listener's "
                        "principal is the certificate's subject")
    g.add_argument("--ssl-cafile", default=None, help="PEM CA certificate(s) that client certificates must chain to")
    g.add_argument("--sasl-mechanisms", default="PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
                   help="enabled SASL mechanisms, comma separated (OAUTHBEARER, with unsecured tokens, "
                        "only when listed)")
    g.add_argument("--connections-max-reauth-ms", type=int, default=0, metavar="MS",
                   help="a SASL login lasts this long, then the client re-authenticates or its connection "
                        "closes (KIP-368; 0: forever)")
    g.add_argument("--listener-reauth-ms", action="append", default=[], metavar="NAME=MS",
                   help="connections.max.reauth.ms of one listener (repeatable)")
    g.add_argument("--oauthbearer-clock-skew-ms", type=int, default=None, metavar="MS",
                   help="OAUTHBEARER: clock skew allowed when checking a token's exp, iat and nbf "
                        "(default 0 for unsecured tokens, 30000 with --oauthbearer-jwks)")
    g.add_argument("--oauthbearer-required-scope", default="", metavar="SCOPE[,SCOPE]",
                   help="OAUTHBEARER: scopes every token must carry")
    g.add_argument("--oauthbearer-sub-claim", default="sub", metavar="NAME",
                   help="OAUTHBEARER: the claim naming the principal (default sub)")
    g.add_argument("--oauthbearer-scope-claim", default="scope", metavar="NAME",
                   help="OAUTHBEARER: the claim holding the scopes (default scope)")
    _signed_oauth_args(g)
    g.add_argument("--super-user", action="append", default=[], metavar="User:NAME",
                   help="principal that passes every ACL check (repeatable)")
    g.add_argument("--authorizer", choices=["auto", "on", "off"], default="auto",
                   help="ACL checks: auto = on when a listener uses SASL or client certificates")
    g.add_argument("--allow-everyone-if-no-acl-found", action="store_true",
                   help="a resource without any ACL is open to all (off by default)")
    g.add_argument("--inter-broker-listener", default=None, metavar="NAME",
                   help="listener other brokers connect to (Kafka's inter.broker.listener.name; "
                        "default: the --host/--port one, named DEFAULT)")
    g.add_argument("--inter-broker-sasl-mechanism", default=None, choices=["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"],
                   help="SASL mechanism between brokers (default: the strongest enabled)")
    g.add_argument("--inter-broker-user", default=None, metavar="NAME",
                   help="the login brokers use with each other on a SASL inter-broker listener "
                        "(make it a --super-user)")
    g.add_argument("--inter-broker-password-env", default=None, metavar="VAR",
                   help="environment variable holding --inter-broker-user's password")
    g.add_argument("--inter-broker-password-file", default=None, metavar="FILE",
                   help="file holding --inter-broker-user's password (one line)")


def _signed_oauth_args(g) -> None:
    """Signed OAUTHBEARER tokens (Kafka's KIP-768 sasl.oauthbearer.* options)."""
    g.add_argument("--oauthbearer-jwks", default=None, metavar="PATH|URL",
                   help="OAUTHBEARER: accept only tokens signed by a key of this JWKS (a file or an "
                        "http(s) URL; the 'oauth' extra); unsecured tokens are then refused")
    g.add_argument("--oauthbearer-expected-audience", default="", metavar="AUD[,AUD]",
                   help="OAUTHBEARER signed tokens: the aud claim must name one of these")
    g.add_argument("--oauthbearer-expected-issuer", default=None, metavar="ISS",
                   help="OAUTHBEARER signed tokens: the iss claim must be this")
    g.add_argument("--oauthbearer-jwks-refresh-ms", type=int, default=3_600_000, metavar="MS",
                   help="fetch the JWKS again this often (default 3600000)")
    g.add_argument("--oauthbearer-jwks-retry-backoff-ms", type=int, default=100, metavar="MS",
                   help="first wait before fetching a URL JWKS again after a failure, doubling (default 100)")
    g.add_argument("--oauthbearer-jwks-retry-backoff-max-ms", type=int, default=10_000, metavar="MS",
                   help="most time spent retrying one JWKS fetch (default 10000)")
    g.add_argument("--oauthbearer-jwks-unknown-kid-refresh-ms", type=int, default=10_000, metavar="MS",
                   help="a token naming an unknown kid fetches the JWKS again at most once per this "
                        "long (default 10000)")


def _apply_signed_oauth(cfg, args) -> None:
    if args.oauthbearer_jwks is None:
        return
    from .optional import require
    require("jwt", "--oauthbearer-jwks (signed OAUTHBEARER tokens)")
    require("cryptography", "--oauthbearer-jwks (signed OAUTHBEARER tokens)")
    if "OAUTHBEARER" not in cfg.sasl_enabled_mechanisms:
        raise CliError("--oauthbearer-jwks needs OAUTHBEARER in --sasl-mechanisms")
    numbers = ("jwks_refresh_ms", "jwks_retry_backoff_ms", "jwks_retry_backoff_max_ms",
               "jwks_unknown_kid_refresh_ms")
    for name in numbers:
        value = getattr(args, f"oauthbearer_{name}")
        if value < (1 if name == "jwks_refresh_ms" else 0):
            raise CliError(f"--oauthbearer-{name.replace('_', '-')} must be "
                           f"{'at least 1' if name == 'jwks_refresh_ms' else '>= 0'}")
        setattr(cfg, f"sasl_oauthbearer_{name}", value)
    from ..broker.auth.oauth_jwks import JwksSource
    try:
        JwksSource(args.oauthbearer_jwks)
    except ValueError as exc:
        raise CliError(f"--oauthbearer-jwks: {exc}") from None
    cfg.sasl_oauthbearer_jwks = args.oauthbearer_jwks
    cfg.sasl_oauthbearer_expected_audience = tuple(
        a.strip() for a in args.oauthbearer_expected_audience.split(",") if a.strip())
    cfg.sasl_oauthbearer_expected_issuer = args.oauthbearer_expected_issuer


def _apply_security(cfg, args) -> None:
    cfg.security_protocol = args.security_protocol
    cfg.listeners = list(args.listener)
    for item in args.listener_protocol:
        name, sep, proto = item.partition("=")
        if not sep or not name:
            raise CliError(f"--listener-protocol wants NAME=PROTOCOL, got {item!r}")
        cfg.listener_security_protocol_map[name] = proto
    cfg.ssl_certfile, cfg.ssl_keyfile = args.ssl_certfile, args.ssl_keyfile
    cfg.ssl_client_auth, cfg.ssl_cafile = args.ssl_client_auth, args.ssl_cafile
    if cfg.ssl_client_auth != "none" and not cfg.ssl_cafile:
        raise CliError(f"--ssl-client-auth {cfg.ssl_client_auth} needs --ssl-cafile (the CA of client certificates)")
    cfg.sasl_enabled_mechanisms = tuple(m.strip() for m in args.sasl_mechanisms.split(",") if m.strip())
    _apply_sasl_sessions(cfg, args)
    bad = [u for u in args.super_user if not u.startswith("User:") or u == "User:"]
    if bad:
        raise CliError(f"--super-user wants User:NAME, got {bad[0]!r}")
    cfg.super_users = set(args.super_user)
    cfg.authorizer_enabled = {"auto": None, "on": True, "off": False}[args.authorizer]
    cfg.allow_everyone_if_no_acl_found = args.allow_everyone_if_no_acl_found
    try:
        listeners = cfg.all_listeners()
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if any(lst.tls for lst in listeners) and not (cfg.ssl_certfile and cfg.ssl_keyfile):
        raise CliError("an SSL or SASL_SSL listener needs --ssl-certfile and --ssl-keyfile")
    _apply_inter_broker(cfg, args)


def _apply_inter_broker(cfg, args) -> None:
    """The inter-broker listener, mechanism and login (checked in full once --metadata says
    this broker has peers: a single node never dials one)."""
    cfg.inter_broker_listener_name = args.inter_broker_listener
    cfg.inter_broker_sasl_mechanism = args.inter_broker_sasl_mechanism
    cfg.inter_broker_user = args.inter_broker_user
    if args.inter_broker_password_env and args.inter_broker_password_file:
        raise CliError("give --inter-broker-password-env or --inter-broker-password-file, not both")
    if args.inter_broker_password_env:
        cfg.inter_broker_password = os.environ.get(args.inter_broker_password_env)
        if not cfg.inter_broker_password:
            raise CliError(f"--inter-broker-password-env: ${args.inter_broker_password_env} is not set")
    elif args.inter_broker_password_file:
        try:
            cfg.inter_broker_password = Path(args.inter_broker_password_file).read_text().rstrip("\r\n")
        except OSError as exc:
            raise CliError(f"--inter-broker-password-file {args.inter_broker_password_file}: "
                           f"{exc.strerror or exc}") from None
        if not cfg.inter_broker_password:
            raise CliError(f"--inter-broker-password-file {args.inter_broker_password_file} is empty")
    if cfg.inter_broker_password is not None and not cfg.inter_broker_user:
        raise CliError("an inter-broker password needs --inter-broker-user")


def _check_inter_broker(cfg) -> None:
    """A broker with peers must be able to reach them: refused here in one line, not
    found out at its first follower fetch."""
    from ..cluster.peer import PeerDialer
    try:
        PeerDialer.from_config(cfg)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:   # (ssl.SSLError too) the CA file or this broker's certificate
        raise CliError(f"inter-broker TLS: cannot load --ssl-cafile {cfg.ssl_cafile} or this broker's "
                       f"certificate: {exc.strerror or exc}") from None


def _apply_sasl_sessions(cfg, args) -> None:
    """Re-authentication (KIP-368) and the OAUTHBEARER validator's options."""
    if args.connections_max_reauth_ms < 0 or (args.oauthbearer_clock_skew_ms or 0) < 0:
        raise CliError("--connections-max-reauth-ms and --oauthbearer-clock-skew-ms must be >= 0")
    cfg.connections_max_reauth_ms = args.connections_max_reauth_ms
    for item in args.listener_reauth_ms:
        name, sep, ms = item.partition("=")
        if not sep or not name or not ms.isdigit():
            raise CliError(f"--listener-reauth-ms wants NAME=MS, got {item!r}")
        cfg.listener_connections_max_reauth_ms[name] = int(ms)
    cfg.sasl_oauthbearer_clock_skew_ms = args.oauthbearer_clock_skew_ms
    cfg.sasl_oauthbearer_required_scope = tuple(s for s in args.oauthbearer_required_scope.split(",") if s)
    cfg.sasl_oauthbearer_principal_claim = args.oauthbearer_sub_claim
    cfg.sasl_oauthbearer_scope_claim = args.oauthbearer_scope_claim
    _apply_signed_oauth(cfg, args)


def build_config(args):
    from ..broker.config import BrokerConfig
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port must be 0..65535, got {args.port}")
    if args.default_partitions < 1:
        raise CliError("--default-partitions must be at least 1")
    cfg = BrokerConfig(data_dir=args.data_dir, host=args.host, port=args.port,
                       advertised_host=args.advertised_host, auto_create_topics=args.auto_create_topics,
                       default_partitions=args.default_partitions, metrics_port=args.metrics_port)
    cfg.log.flush_mode = args.flush_mode
    cfg.log.flush_interval_ms = args.flush_interval_ms
    cfg.group_consumer_migration_policy = args.group_consumer_migration_policy
    for flag, path in _OVERRIDES.items():
        value = getattr(args, flag)
        if value is None:
            continue
        if value < -1:
            raise CliError(f"--{flag.replace('_', '-')} must be -1 or more")
        target = cfg
        *parents, leaf = path.split(".")
        for name in parents:
            target = getattr(target, name)
        setattr(target, leaf, value)
    _apply_security(cfg, args)
    _apply_cluster(cfg, args)
    try:
        cfg.log.validate()
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return cfg


def run(args) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = build_config(args)
    try:
        args.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot use data dir {args.data_dir}: {exc.strerror}") from None
    from ..broker.server import BrokerStartError, run_broker
    try:
        run_broker(cfg)
    except OSError as exc:
        raise CliError(f"cannot start: {exc.strerror or exc}") from None
    except BrokerStartError as exc:
        raise CliError(f"cannot start: {exc}") from None
    return 0
