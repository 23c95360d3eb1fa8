"""The broker process: storage, coordinators and the asyncio server.

One `Broker` owns the LogManager, the group-commit flusher, the group and
transaction coordinators and the metrics. Connections are served by
`connection.serve`; request handling lives in `handlers/`, one module per API
family.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import time

from ..clock import wall_ms
from ..cluster.broker_configs import FileBrokerConfigs
from ..cluster.peer import PeerDialer
from ..cluster.shutdown import controlled_shutdown
from ..storage.committed import Committed, HighWatermarks, OneNode
from ..storage.flusher import GroupCommitFlusher
from ..storage.fs import fs_from_env
from ..storage.errors import StorageError
from ..storage.manager import LogManager
from . import handlers  # noqa: F401  (registers every route)
from .allocator import tune_allocator
from .auth.acl import FILE_NAME as ACL_FILE, AclStore, Authorizer
from .auth.cluster_store import cluster_stores
from .auth.users import FILE_NAME as USER_FILE, UserStore
from .config import BrokerConfig, Listener
from .connection import ConnectionLimits, serve
from .metrics import BrokerMetrics
from .node_view import CoordinatorPlacement, MetadataView, NodeView
from .notify import AppendNotifier
from .watchdog import LoopWatchdog
from .services import Services
from .wiring import build_groups, build_replicas, build_services, build_txns, cluster_member

log = logging.getLogger("semel.broker")


class Broker:
    def __init__(self, config: BrokerConfig):
        self.config = config
        self.fs = fs_from_env()
        self.logs: LogManager | None = None
        self.flusher = GroupCommitFlusher()
        self.notifier = AppendNotifier()
        self.metrics = BrokerMetrics(self)   # gauges read broker state at scrape time
        self.limits = ConnectionLimits(config, self.metrics)
        self.watchdog = LoopWatchdog(self.metrics, config.loop_lag_warn_ms / 1000, config.loop_stall_ms / 1000)
        self.group_coordinator = None
        self.txn_coordinator = None
        self._server: asyncio.base_events.Server | None = None
        self._extra_servers: list = []   # listeners after the first (config.listeners)
        self.listeners: list[Listener] = []
        # Security: users and ACLs live in files under the data dir, re-read
        # when they change, so `semel user|acl` apply without a restart.
        self.users = UserStore(config.data_dir)
        self.acls = AclStore(config.data_dir)
        authenticating = config.authenticating
        self.authorizer = Authorizer(
            self.acls, authenticating if config.authorizer_enabled is None else config.authorizer_enabled,
            set(config.super_users), config.allow_everyone_if_no_acl_found)
        # The cluster view (semel.cluster.state.ClusterView) when a metadata service is
        # configured; None on the embedded single node, where handlers take their single-node paths.
        self.cluster = None
        self.cluster_member = None
        # Dynamic broker configs (semel.cluster.broker_configs): in etcd in a cluster, in
        # a file of the data dir on a single node; set in start().
        self.broker_configs = None
        # Replication data plane (semel.cluster.replica_manager.ReplicaManager), started when
        # `cluster` is set; None on a single node.
        self.replicas = None
        # What a commit waits on past this broker's fsync (semel.storage.committed): a
        # single node is the ISR of every partition (OneNode); a cluster member's replica
        # manager, once replication runs (None until then: nothing is committed).
        self.high_watermarks: HighWatermarks | None = OneNode(self.notifier.notify)
        # Produce acks=all and admin markers: fsynced as the flush policy asks, then past
        # the high watermark.
        self.committed = Committed(self.flusher if config.log.flush_mode == "always" else None,
                                   lambda: self.high_watermarks, config.request_timeout_ms / 1000)
        # semel.cluster.peer.PeerDialer in a cluster: the inter-broker listener and login.
        self.peer_dialer = None
        # Signed OAUTHBEARER tokens (auth.oauth_jwks.SignedValidator) when a JWKS is set.
        self.oauth_signed = None
        # What handlers use (semel.broker.services), built once every part exists and
        # before the first connection is served.
        self.services: Services | None = None
        self._tasks: list[asyncio.Task] = []
        self._stopped = asyncio.Event()
        self.started_at = time.monotonic()

    def _use_cluster_security(self) -> None:
        """In a cluster users and ACLs live in etcd, the same on every broker
        (auth/cluster_store.py); files under the data dir are not read."""
        self.users, self.acls = cluster_stores(self.cluster)
        self.authorizer.store = self.acls
        for name in (USER_FILE, ACL_FILE):
            if (self.config.data_dir / name).exists():
                log.warning("%s is ignored in a cluster: users and ACLs are kept in etcd "
                            "(semel user|acl --metadata ENDPOINTS)", self.config.data_dir / name)

    # --- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        t0 = time.monotonic()
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        self.logs = LogManager(self.config.data_dir, self.config.log, self.fs)
        # Under "always" nothing counts before it is fsynced, alone or in an ISR: readers see
        # no record a power cut could take (PartitionLog.durable_end).
        self.logs.set_reads_wait_for_fsync(self.config.log.flush_mode == "always")
        if self.config.metadata_endpoints:
            self.cluster_member = cluster_member(self)
            self.cluster = self.cluster_member.view
            self.broker_configs = self.cluster_member.configs
            self._use_cluster_security()
        else:   # a damaged file stops the start here, naming it
            self.broker_configs = FileBrokerConfigs(self, self.config.node_id, self.fs, self.config.data_dir)
            self.broker_configs.load()
            self.broker_configs.apply()
        # What handlers read of the cluster: a single node is a cluster of one.
        self.metadata_view: MetadataView = NodeView(self.config, self.logs, lambda: self.listeners)
        self.coordinators_at: CoordinatorPlacement = self.metadata_view
        if self.cluster is not None:   # how followers and the coordinator reach other brokers
            self.metadata_view = self.cluster
            self.coordinators_at = self.cluster_member
            self.high_watermarks = None   # until replication runs
            self.peer_dialer = PeerDialer.from_config(self.config)
            who = self.peer_dialer.principal
            if who and self.authorizer.enabled and who not in self.config.super_users:
                log.warning("inter-broker login %s is no --super-user: peers refuse its fetches and "
                            "markers unless an ACL grants it ClusterAction on the cluster", who)
        await self._start_coordinators()
        # A damaged users/ACL file stops the start here, naming it (ValueError -> one line).
        self.users.names()
        self.acls.bindings()
        if self.config.sasl_oauthbearer_jwks:   # no JWKS, no start (ValueError -> one line)
            from .auth.oauth_jwks import start_signed_validator   # needs the oauth extra
            self.oauth_signed = await start_signed_validator(self.config)
            self._tasks.append(asyncio.create_task(self.oauth_signed.keys.run(), name="jwks-refresh"))
        listeners = self.config.all_listeners()
        self.listeners = listeners   # with their bound ports: a cluster member advertises them
        self._server = await self._listen(listeners[0])
        if self.config.port == 0:
            self.config.port = self._server.sockets[0].getsockname()[1]
        for lst in listeners[1:]:
            self._extra_servers.append(await self._listen(lst))
        if self.cluster_member is not None:   # registers with the bound port
            await self.cluster_member.start()
        if self.cluster is not None:
            self.replicas = build_replicas(self)
            self.high_watermarks = self.replicas
            await self.replicas.start()
        # After replication: each partition state reaches the replica manager (which
        # takes the role) before the coordinators' seats act on it.
        self.group_coordinator.start_seats()
        self.txn_coordinator.start_seats()
        self.services = build_services(self)
        await self._open_doors()
        # Watched from the moment clients can connect (loading logs at start holds the
        # loop on purpose: nobody is being served yet).
        self._tasks.append(asyncio.create_task(self.watchdog.run(), name="loop-watchdog"))
        self._tasks.append(asyncio.create_task(self._retention_loop(), name="retention"))
        self._tasks.append(asyncio.create_task(self.limits.run(), name="connection-limits"))
        if self.config.log.flush_mode == "interval":
            self._tasks.append(asyncio.create_task(self.flusher.run_interval_flush(
                lambda: [plog for _, plog in self.logs.all_logs()], self.config.log.flush_interval_ms)))
        if self.config.metrics_port:
            self.metrics.serve(self.config.host, self.config.metrics_port)
        log.info("semel broker listening on %s:%d (data %s, started in %.2fs)",
                 self.config.host, self.config.port, self.config.data_dir, time.monotonic() - t0)

    async def _listen(self, lst: Listener):
        # Ports are bound first (a cluster member registers them) but connections are
        # accepted only once the services exist, the coordinators' seats started and a
        # cluster member has joined (`_open_doors`), as a Kafka broker enables request processing only after
        # catching up with the metadata.
        server = await asyncio.start_server(
            lambda r, w: serve(self._serving(), self.limits, r, w, lst), lst.host, lst.port,
            reuse_address=True, limit=1 << 20, ssl=self._tls_context() if lst.tls else None,
            start_serving=False)
        lst.port = server.sockets[0].getsockname()[1]
        log.info("listener %s %s://%s:%d", lst.name, lst.protocol, lst.host, lst.port)
        return server

    def _serving(self) -> Services:
        assert self.services is not None, "connections are accepted only once the services are built"
        return self.services

    async def _open_doors(self) -> None:
        """Start accepting once the services are built and the seats started; in a cluster,
        once joined. A broker restarted within its lease's TTL waits there for its old
        session to end; a Metadata answered meanwhile, from a view
        not yet loaded, listed no broker and no topic, and librdkafka drops every broker
        it knows that an answer leaves out: with metadata.recovery.strategy=none it then
        had none to ask again and a transactional producer stalled (docs/cluster.md)."""
        for server in (self._server, *self._extra_servers):
            await server.start_serving()

    def _tls_context(self):
        import ssl
        if not (self.config.ssl_certfile and self.config.ssl_keyfile):
            raise ValueError("an SSL/SASL_SSL listener needs ssl_certfile and ssl_keyfile")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.config.ssl_certfile, self.config.ssl_keyfile)
        if self.config.ssl_client_auth != "none":   # mTLS: the principal comes from the certificate
            ctx.load_verify_locations(cafile=self.config.ssl_cafile)
            ctx.verify_mode = ssl.CERT_REQUIRED if self.config.ssl_client_auth == "required" else ssl.CERT_OPTIONAL
        return ctx

    async def _start_coordinators(self) -> None:
        # Groups first: the transaction coordinator writes offset markers through them.
        self.group_coordinator = build_groups(self)
        await self.group_coordinator.start()
        self.txn_coordinator = build_txns(self)
        await self.txn_coordinator.start()

    async def stop(self) -> None:
        if self.cluster_member is not None and self.replicas is not None:
            # Leaderships and coordinators to in-sync peers first (semel.cluster.shutdown).
            await controlled_shutdown(self.cluster, self.replicas, self.config.controlled_shutdown_timeout_ms / 1000)
        if self.replicas is not None:   # no more fetching or ISR changes from here on
            await self.replicas.stop()
        if self.cluster_member is not None:   # leave first: others take over without waiting out the lease
            await self.cluster_member.stop()
        if self._server is not None:
            self._server.close()
        for server in self._extra_servers:
            server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.txn_coordinator is not None:
            await self.txn_coordinator.stop()
        if self.group_coordinator is not None:
            await self.group_coordinator.stop()
        if self.logs is not None:
            self.logs.close()
        self._stopped.set()
        log.info("semel broker stopped")

    async def serve_forever(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopped.set)
        await self._stopped.wait()
        self._stopped.clear()
        await self.stop()

    async def _retention_loop(self) -> None:
        interval = self.config.retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                self.logs.enforce_retention(wall_ms())
            except Exception:  # retention must never take the broker down
                log.exception("retention failed")


class BrokerStartError(Exception):
    """The broker cannot start on this data (a damaged file, named in the message)."""


def run_broker(config: BrokerConfig) -> None:
    """Run in the foreground until SIGTERM/SIGINT."""
    tune_allocator()   # before the big buffers come: see allocator.py
    try:
        import uvloop
        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is pinned, but the broker runs without it
        pass

    async def main() -> None:
        broker = Broker(config)
        try:
            await broker.start()
        except (StorageError, RuntimeError, ValueError, OSError) as exc:   # OSError: a listener's port or TLS files
            # Damaged files on disk: one clear line naming the file, not a traceback; the
            # same data will fail the same way on every restart until someone acts.
            log.error("cannot start on %s: %s", config.data_dir, exc)
            raise BrokerStartError(str(exc)) from None
        print(f"semel broker ready on {config.host}:{config.port}", flush=True)
        await broker.serve_forever()

    asyncio.run(main())
