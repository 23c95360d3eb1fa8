"""etcd and N broker processes on this machine: `semel cluster start` and the tests."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..client.client import Client, ClientError
from .etcd import EtcdProcess
from .process import SemelBroker


class LocalCluster:
    """etcd under data_dir/etcd, broker N under data_dir/broker-N (node id N).

    Ports: broker N on base_port + N and etcd on etcd_port (peer etcd_port + 1), or
    free ones when None. Restarting a broker or the whole cluster reuses the ports and
    data, as a machine coming back would.
    """

    def __init__(self, data_dir: Path, nodes: int = 3, base_port: int | None = None, etcd_port: int | None = None,
                 lease_ttl_s: int = 6, broker_args: list[str] = (), *, env: dict | None = None,
                 prepare: Callable[[str], None] | None = None, connect=None):
        """`env`: extra environment of every broker (e.g. the inter-broker password's
        variable); `prepare(etcd_endpoint)`: run once etcd is up and before any broker
        starts, to write what brokers read at start (e.g. the users they log in with:
        semel.broker.auth.cluster_store.save_users); `connect(bootstrap)`: a logged-in
        semel Client where the listeners want one."""
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.etcd = EtcdProcess(self.data_dir / "etcd", etcd_port, etcd_port + 1 if etcd_port else None,
                                log_path=self.data_dir / "etcd.log")
        self.base_port, self.lease_ttl_s, self.broker_args, self.env = base_port, lease_ttl_s, list(broker_args), env
        self.brokers = [self.new_broker(n) for n in range(nodes)]
        self.connect = connect or _plain_client
        self.prepare = prepare

    def new_broker(self, n: int) -> SemelBroker:
        """Broker `n` as this cluster makes it (not started): node id, etcd, lease, flags."""
        return SemelBroker(self.data_dir / f"broker-{n}", self.base_port + n if self.base_port else None,
                           log_path=self.data_dir / f"broker-{n}.log",
                           extra_args=["--node-id", str(n), "--metadata", self.etcd.bootstrap,
                                       "--lease-ttl-s", str(self.lease_ttl_s), *self.broker_args], env=self.env)

    def add_broker(self, timeout_s: float = 60) -> int:
        """Start one more broker (the next node id, the same flags) and return its node id.
        It joins with no replicas: reassignment moves partitions onto it."""
        n = len(self.brokers)
        self.brokers.append(self.new_broker(n))
        self.brokers[n].start(timeout_s)
        return n

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers)

    def start_etcd(self, timeout_s: float = 60) -> None:
        """etcd (EtcdProcess.start waits until it is healthy), then `prepare`."""
        if not self.etcd.alive():   # a caller may have started it to write users and ACLs
            self.etcd.start(timeout_s)
        if self.prepare is not None:
            self.prepare(self.etcd.bootstrap)

    def start(self, timeout_s: float = 60) -> "LocalCluster":
        """etcd first, then each broker."""
        self.start_etcd(timeout_s)
        for b in self.brokers:
            b.start(timeout_s)
        return self

    def stop(self) -> None:
        """Brokers first, each leaving the cluster (revoking its lease) while etcd is up."""
        for b in self.brokers:
            b.stop()
        self.etcd.stop()

    def close(self) -> None:
        for b in self.brokers:
            b.close()
        self.etcd.close()

    def metadata(self, topics=None, skip=frozenset()):
        """Metadata from the first live broker (node ids in `skip` aside) that answers,
        None when none does."""
        for n, b in enumerate(self.brokers):
            if n in skip or not b.alive():
                continue
            try:
                with self.connect(b.bootstrap) as c:
                    return c.metadata(topics)
            except (ClientError, OSError):
                continue
        return None

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.close()


def _plain_client(bootstrap: str) -> Client:
    return Client(bootstrap, timeout_s=5)
