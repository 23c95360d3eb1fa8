"""`Cluster`: etcd and three (or N) semel brokers on this machine, each broker a
`Broker` with its faults (semel.launch.local_cluster starts them)."""
from __future__ import annotations

from pathlib import Path

from ..launch.etcd import etcd_binary
from ..launch.local_cluster import LocalCluster
from . import reaper
from .broker import TEST_BROKER_ARGS, Broker, start_or_explain
from .security import ClientSecurity, client_configs
from .topics import TopicFactory


class Cluster:
    """`bootstrap_servers` (every broker), `brokers[n]` (node id n) with kill(),
    restart(), pause() and resume(); topics default to replication factor min(3, nodes).

    Raises FileNotFoundError (with the install command) where etcd is missing."""

    def __init__(self, data_dir: Path, nodes: int = 3, extra_args: tuple[str, ...] = (),
                 start_timeout_s: float = 60.0):
        etcd_binary()   # the `cluster` extra: say so before starting anything
        self.replication_factor = min(3, nodes)
        self.security = ClientSecurity()
        self.start_timeout_s = start_timeout_s
        self.local = LocalCluster(Path(data_dir), nodes, lease_ttl_s=3,
                                  broker_args=[*TEST_BROKER_ARGS, *_replication(nodes), *extra_args])
        for p in (self.local.etcd, *self.local.brokers):
            p.die_with_parent = True
        self.brokers = [Broker(p, self.security, start_timeout_s=start_timeout_s) for p in self.local.brokers]
        reaper.track(self)

    def start(self) -> "Cluster":
        try:
            start_or_explain(self.local.etcd, f"etcd on {self.local.etcd.bootstrap}", self.start_timeout_s)
            for b in self.brokers:
                b.start()
        except BaseException:
            self.close()
            raise
        return self

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(b.bootstrap_servers for b in self.brokers)

    def client_configs(self) -> dict[str, dict]:
        return client_configs(self.bootstrap_servers, self.security)

    def topics(self, prefix: str = "t") -> TopicFactory:
        return TopicFactory(lambda: self.security.connect(self.bootstrap_servers), prefix, self.replication_factor)

    def recover(self) -> None:
        """Undo what a test left: every broker resumed and running."""
        for b in self.brokers:
            b.recover()

    def close(self) -> None:
        self.local.close()
        reaper.untrack(self)

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _replication(nodes: int) -> list[str]:
    """As `semel cluster start`: topics on min(3, nodes) brokers and, at 3, acks=all
    waiting for 2 of them, so a write survives the loss of any one broker."""
    rf = min(3, nodes)
    return ["--default-replication-factor", str(rf)] + (["--min-insync-replicas", "2"] if rf == 3 else [])
