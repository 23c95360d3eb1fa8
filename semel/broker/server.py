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
import ssl
import time
from typing import TYPE_CHECKING

from ..clock import wall_ms
from ..coordinator.partition_markers import PartitionMarkers
from ..coordinator.partitioned import GroupCoordinators, TxnCoordinators
from ..storage.committed import Committed
from ..storage.flusher import GroupCommitFlusher
from ..storage.fs import fs_from_env
from ..storage.errors import StorageError
from ..storage.manager import LogManager
from . import handlers  # noqa: F401  (registers every route)
from .allocator import tune_allocator
from .auth.acl import AclStore, Authorizer
from .auth.cluster_store import ClusterAclStore, ClusterUserStore
from .auth.users import UserStore
from .config import BrokerConfig, Listener
from .connection import ConnectionLimits, serve
from .metrics import BrokerMetrics
from .node_role import NodeRole, role_for
from .notify import AppendNotifier
from .watchdog import LoopWatchdog
from .services import Services
from ..coordinator.share_coordinator import ShareCoordinator
from .wiring import build_groups, build_partition_markers, build_services, build_share, build_txns

if TYPE_CHECKING:   # the oauth extra
    from .auth.oauth_jwks import SignedValidator

log = logging.getLogger("semel.broker")


class Broker:
    def __init__(self, config: BrokerConfig, role: NodeRole | None = None):
        self.config = config
        self.fs = fs_from_env()
        self._logs: LogManager | None = None   # opened in start()
        self.flusher = GroupCommitFlusher()
        self.notifier = AppendNotifier()
        self.metrics = BrokerMetrics(self)   # gauges read broker state at scrape time
        self.limits = ConnectionLimits(config, self.metrics)
        self.watchdog = LoopWatchdog(self.metrics, config.loop_lag_warn_ms / 1000, config.loop_stall_ms / 1000)
        self.group_coordinator: GroupCoordinators | None = None
        self.share_coordinator: ShareCoordinator | None = None
        self.txn_coordinator: TxnCoordinators | None = None
        self._server: asyncio.base_events.Server | None = None
        self._extra_servers: list[asyncio.Server] = []   # listeners after the first (config.listeners)
        self.listeners: list[Listener] = []
        # Security: users and ACLs live in files under the data dir, re-read
        # when they change, so `semel user|acl` apply without a restart.
        self.users: UserStore | ClusterUserStore = UserStore(config.data_dir)
        self.acls: AclStore | ClusterAclStore = AclStore(config.data_dir)
        authenticating = config.authenticating
        self.authorizer = Authorizer(
            self.acls, authenticating if config.authorizer_enabled is None else config.authorizer_enabled,
            set(config.super_users), config.allow_everyone_if_no_acl_found)
        # A single node (a cluster of one) or a cluster member: everything that differs
        # between the two (semel.broker.node_role), chosen once.
        self.role: NodeRole = role if role is not None else role_for(bool(config.metadata_endpoints))
        # Produce acks=all and admin markers: fsynced as the flush policy asks, then past
        # the role's high watermark (at once on a single node; in a cluster once every
        # in-sync replica holds them, nothing before replication runs).
        self.committed = Committed(self.flusher if config.log.flush_mode == "always" else None,
                                   lambda: self.role.high_watermarks, config.request_timeout_ms / 1000)
        # Signed OAUTHBEARER tokens (auth.oauth_jwks.SignedValidator) when a JWKS is set.
        self.oauth_signed: SignedValidator | None = None
        # What handlers use (semel.broker.services), built once every part exists and
        # before the first connection is served.
        self.services: Services | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        self.started_at = time.monotonic()

    @property
    def logs(self) -> LogManager:
        assert self._logs is not None, "opened in start()"
        return self._logs

    # --- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        t0 = time.monotonic()
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        self._logs = LogManager(self.config.data_dir, self.config.log, self.fs)
        # Under "always" nothing counts before it is fsynced, alone or in an ISR: readers see
        # no record a power cut could take (PartitionLog.durable_end).
        self.logs.set_reads_wait_for_fsync(self.config.log.flush_mode == "always")
        self.role.open(self)
        groups, txns, markers = await self._start_coordinators()
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
        await self.role.join()
        # After replication: each partition state reaches the replica manager (which
        # takes the role) before the coordinators' seats act on it.
        groups.start_seats()
        txns.start_seats()
        share = self.share_coordinator = build_share(self)
        if share is not None:
            await share.start()
            share.start_seat()
        self.services = build_services(self, groups, txns, markers, share)
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

    async def _listen(self, lst: Listener) -> asyncio.Server:
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
            if server is not None:   # (the first is bound in start() before this runs)
                await server.start_serving()

    def _tls_context(self) -> ssl.SSLContext:
        if not (self.config.ssl_certfile and self.config.ssl_keyfile):
            raise ValueError("an SSL/SASL_SSL listener needs ssl_certfile and ssl_keyfile")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.config.ssl_certfile, self.config.ssl_keyfile)
        if self.config.ssl_client_auth != "none":   # mTLS: the principal comes from the certificate
            ctx.load_verify_locations(cafile=self.config.ssl_cafile)
            ctx.verify_mode = ssl.CERT_REQUIRED if self.config.ssl_client_auth == "required" else ssl.CERT_OPTIONAL
        return ctx

    async def _start_coordinators(self) -> tuple[GroupCoordinators, TxnCoordinators, PartitionMarkers]:
        # Groups first: the transaction coordinator writes offset markers through them.
        groups = self.group_coordinator = build_groups(self)
        await groups.start()
        markers = build_partition_markers(self)
        txns = self.txn_coordinator = build_txns(self, groups, markers)
        await txns.start()
        return groups, txns, markers

    def coordinators(self) -> tuple[GroupCoordinators, TxnCoordinators]:
        """The group and transaction coordinators, once started."""
        assert self.group_coordinator is not None and self.txn_coordinator is not None, "built in start()"
        return self.group_coordinator, self.txn_coordinator

    def follow_deleted_topics(self, names: set[str]) -> None:
        """A cluster's topics were deleted: the groups drop their offsets (topics sync
        before the coordinators are built, when there is nothing to drop yet)."""
        if self.group_coordinator is not None:
            self.group_coordinator.follow_deleted_topics(names)
        if self.share_coordinator is not None:   # a topic created again under a name starts afresh
            self.share_coordinator.forget_topics(names)

    async def stop(self) -> None:
        if self._logs is not None:   # started: leaderships and coordinators to peers first
            await self.role.leave()
        if self._server is not None:
            self._server.close()
        for server in self._extra_servers:
            server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.txn_coordinator is not None:
            await self.txn_coordinator.stop()
        if self.share_coordinator is not None:
            await self.share_coordinator.stop()
        if self.group_coordinator is not None:
            await self.group_coordinator.stop()
        if self._logs is not None:
            self._logs.close()
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
