"""etcd and N broker processes on this machine: `semel cluster start` and the tests."""
from __future__ import annotations

from pathlib import Path

from ..cli.process import SemelBroker
from .etcd import EtcdProcess


class LocalCluster:
    """etcd under data_dir/etcd, broker N under data_dir/broker-N (node id N).

    Ports: broker N on base_port + N and etcd on etcd_port (peer etcd_port + 1), or
    free ones when None. Restarting a broker or the whole cluster reuses the ports and
    data, as a machine coming back would.
    """

    def __init__(self, data_dir: Path, nodes: int = 3, base_port: int | None = None, etcd_port: int | None = None,
                 lease_ttl_s: int = 6, broker_args: list[str] = (), *, env: dict | None = None,
                 users: dict[str, str] | None = None, connect=None):
        """`env`: extra environment of every broker (e.g. the inter-broker password's
        variable); `users`: SCRAM users (name -> password) saved in etcd at start();
        `connect(bootstrap)`: a logged-in semel Client where the listeners want one."""
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.etcd = EtcdProcess(self.data_dir / "etcd", etcd_port, etcd_port + 1 if etcd_port else None,
                                log_path=self.data_dir / "etcd.log")
        self.base_port, self.lease_ttl_s, self.broker_args, self.env = base_port, lease_ttl_s, list(broker_args), env
        self.brokers = [self._broker(n) for n in range(nodes)]
        self.connect = connect or _plain_client
        self.users = dict(users or {})

    def _broker(self, n: int) -> SemelBroker:
        return SemelBroker(self.data_dir / f"broker-{n}", self.base_port + n if self.base_port else None,
                           log_path=self.data_dir / f"broker-{n}.log",
                           extra_args=["--node-id", str(n), "--metadata", self.etcd.bootstrap,
                                       "--lease-ttl-s", str(self.lease_ttl_s), *self.broker_args], env=self.env)

    def add_broker(self, timeout_s: float = 60) -> int:
        """Start one more broker (the next node id, the same flags) and return its node id.
        It joins with no replicas: reassignment moves partitions onto it."""
        n = len(self.brokers)
        self.brokers.append(self._broker(n))
        self.brokers[n].start(timeout_s)
        return n

    def security(self):
        """semel.cluster.security.EtcdSecurity of this cluster's etcd (started), for a
        caller that runs its coroutines (asyncio.run)."""
        from .etcd import Etcd
        from .security import EtcdSecurity
        from ..broker.config import BrokerConfig
        return EtcdSecurity(Etcd(self.etcd.bootstrap), BrokerConfig.cluster_id)

    def save_users(self, users: dict[str, str]) -> None:
        """SCRAM users in etcd, where every broker of the cluster checks logins."""
        import asyncio

        async def save():
            sec = self.security()
            try:
                for name, password in users.items():
                    await sec.put_user(name, password)
            finally:
                await sec.etcd.close()
        if users:
            asyncio.run(save())

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers)

    def start(self, timeout_s: float = 60) -> "LocalCluster":
        """etcd first (EtcdProcess.start waits until it is healthy), then each broker."""
        if not self.etcd.alive():   # a caller may have started it to prepare users and ACLs
            self.etcd.start(timeout_s)
        self.save_users(self.users)
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
        from ..client.client import ClientError
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


def _plain_client(bootstrap: str):
    from ..client.client import Client
    return Client(bootstrap, timeout_s=5)
