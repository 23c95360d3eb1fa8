"""Several Broker objects in one process sharing a MemoryClusterView table: the
replication data plane's test bed (no consensus service needed).

The brokers run on one event loop in a background thread, so unmodified clients
(confluent-kafka's blocking calls, semel.client.Client) can talk to them from the
test thread. Elections are done by hand on the table, as the controller would.
"""
from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path

from semel.broker.config import BrokerConfig
from semel.broker.node_role import ClusterNode
from semel.broker.server import Broker
from semel.cluster.broker_configs import FileBrokerConfigs
from semel.cluster.state import BrokerInfo, MemoryClusterView
from semel.protocol.records import iter_batches

from .wait import until


def all_bytes(plog) -> bytes:
    """Every batch of a PartitionLog from its log start to its end, as stored."""
    out, offset = bytearray(), plog.log_start_offset
    while offset < plog.log_end_offset:
        data = plog.read(offset, 1 << 20)
        out += data
        offset = list(iter_batches(data))[-1][1].next_offset
    return bytes(out)


class _Topic:
    def __init__(self, name: str, partitions: int, topic_id: str):
        self.name, self.partitions, self.topic_id = name, partitions, topic_id


class TableView(MemoryClusterView):
    """MemoryClusterView plus the topic catalogue the cluster Metadata handler reads."""

    def __init__(self, table, node_id: int, topics: dict):
        super().__init__(table, node_id)
        self._topics = topics

    def topics(self) -> dict:
        return dict(self._topics)

    def topic_partitions(self, name: str):
        return sorted((st for st in self.partitions() if st.topic == name), key=lambda st: st.partition)


INTERNAL = ("__transaction_state", "__consumer_offsets")


class _FixedMember:
    """Stands in for the control plane's ClusterMember (semel.broker.node_role.Membership):
    the shared table as the cluster view, dynamic configs in a file of the data dir, and
    as coordinator the leader of each internal topic's one partition (MemCluster puts
    both on one broker, alone in their replica set)."""

    def __init__(self, table, view, broker):
        self.table = table
        self.view = view
        self.configs = FileBrokerConfigs(broker, broker.config.node_id, broker.fs, broker.config.data_dir)
        self.configs.load()

    async def coordinator_for(self, key_type: int, key: str | None = None) -> int | None:
        st = self.table.parts.get((INTERNAL[0] if key_type == 1 else INTERNAL[1], 0))
        return st.leader if st is not None and st.leader >= 0 else None

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


class MemCluster:
    def __init__(self, base: Path, nodes: int = 3, coordinator: int = 0, **config):
        self.base = Path(base)
        self.n = nodes
        self.coordinator = coordinator
        # One partition per internal topic: every id has the same coordinator here.
        self.config = {"replica_lag_time_max_ms": 30_000, "replica_fetch_wait_max_ms": 100,
                       "transaction_state_partitions": 1, "offsets_topic_partitions": 1, **config}
        self.table = MemoryClusterView.table()
        self.topics: dict[str, _Topic] = {}
        self.brokers: dict[int, Broker] = {}
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="memcluster", daemon=True)
        self._thread.start()

    # -- running things on the brokers' loop ------------------------------------------
    def run(self, coro_or_fn, timeout: float = 60.0):
        """Await a coroutine (or call a function) on the brokers' loop; returns its result."""
        async def call():
            res = coro_or_fn() if callable(coro_or_fn) else coro_or_fn
            return await res if asyncio.iscoroutine(res) else res
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> "MemCluster":
        for i in range(self.n):
            self.start_broker(i)
        # The coordinators' partitions, led by `coordinator` alone (no follower: its
        # writes are committed as they land); served once its seats have loaded them.
        for name in INTERNAL:
            self.create_topic(name, [(self.coordinator,)])
        c = self.brokers[self.coordinator]
        self.wait(lambda: c.txn_coordinator.parts[0].seat.serving() and c.group_coordinator.parts[0].seat.serving(),
                  "the coordinators loaded")
        return self

    def start_broker(self, i: int) -> Broker:
        cfg = BrokerConfig(data_dir=self.base / f"broker-{i}", port=0, node_id=i, **self.config)
        broker = Broker(cfg, role=ClusterNode(
            lambda b, _replicas: _FixedMember(self.table, TableView(self.table, i, self.topics), b)))

        async def go():
            await broker.start()
            self.table.brokers[i] = BrokerInfo(i, "127.0.0.1", cfg.port)
            for name in self.topics:   # a restarted broker keeps its logs; a new one needs them
                if name not in broker.logs.topics():
                    broker.logs.create_topic(name, self.topics[name].partitions, internal=name.startswith("__"))
            broker.role.replicas.resync()
        self.run(go)
        self.brokers[i] = broker
        return broker

    def stop_broker(self, i: int) -> None:
        """Take broker i away as a crash would look to its peers: its session ends (the
        controller drops it from every ISR), its connections drop; then it shuts down."""
        broker = self.brokers.pop(i)

        async def go():
            self.table.brokers.pop(i, None)
            for st in list(self.table.parts.values()):   # the controller drops a dead broker from ISRs
                if i in st.isr and len(st.isr) > 1:
                    self.table.set_isr(st.topic, st.partition, tuple(r for r in st.isr if r != i))
            for conn in list(broker.limits.open):
                conn.transport.abort()
            await broker.stop()
        self.run(go)

    def close(self) -> None:
        for i in list(self.brokers):
            try:
                self.stop_broker(i)
            except Exception:   # keep closing the others
                pass
        async def drain():   # connections the clients left open end with the loop
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self.run(drain)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    # -- the controller's part, by hand -------------------------------------------------------
    def create_topic(self, name: str, assignment: list[tuple[int, ...]], config: dict | None = None) -> None:
        def go():
            self.topics[name] = _Topic(name, len(assignment), str(uuid.uuid4()))
            for b in self.brokers.values():
                b.logs.create_topic(name, len(assignment), config or {}, internal=name.startswith("__"))
            self.table.create_topic(name, assignment)
        self.run(go)

    def set_leader(self, topic: str, partition: int, leader: int):
        return self.run(lambda: self.table.set_leader(topic, partition, leader))

    def set_isr(self, topic: str, partition: int, isr: tuple[int, ...]):
        return self.run(lambda: self.table.set_isr(topic, partition, isr))

    def state(self, topic: str, partition: int = 0):
        return self.table.parts[(topic, partition)]

    # -- looking at replicas --------------------------------------------------------------------
    def bootstrap(self, i: int | None = None) -> str:
        ids = [i] if i is not None else sorted(self.brokers)
        return ",".join(f"127.0.0.1:{self.brokers[j].config.port}" for j in ids)

    def log(self, i: int, topic: str, partition: int = 0):
        return self.brokers[i].logs.get(topic, partition)

    def log_bytes(self, i: int, topic: str, partition: int = 0) -> bytes:
        """Every byte of replica i's log from its start (read on the brokers' loop)."""
        return self.run(lambda: all_bytes(self.log(i, topic, partition)))

    def wait(self, predicate, what: str, timeout_s: float = 20.0):
        """predicate() (run on the brokers' loop) once truthy; fails naming `what`."""
        return until(lambda: self.run(predicate), what, timeout_s)
