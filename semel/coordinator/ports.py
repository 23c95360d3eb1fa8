"""What a coordinator needs from the broker around it, as small interfaces.

The transaction and group coordinators know nothing of replication or of other
brokers. They are given these when they are built (semel.broker.wiring chooses the
single-node or the cluster implementation) and never look further:

  PartitionWriter   records appended to a partition log are committed when `sync`
                    returns: fsynced and on every in-sync replica (the high watermark
                    passed them). storage.committed.PartitionCommit, on a single node
                    as in a cluster (storage's GroupCommitFlusher alone in tests).
  HighWatermarks    (storage.committed) the high-watermark wait a commit ends with.
                    Single node: storage.committed.OneNode (a cluster of one: at once).
                    Cluster: cluster.replica_manager.ReplicaManager.
  MarkerWriter      a transaction marker for a partition this broker does not lead,
                    written by its leader. Single node: LocalMarkers below (every
                    partition is led here). Cluster: cluster.txn_markers.MarkerChannel.
  ProducerIdSource  producer ids unique across restarts (and brokers) plus the
                    coordinator epoch. Single node: coordinator.producer_ids.
                    ProducerIdManager. Cluster: cluster.producer_ids.ClusterProducerIds.
  CoordinatorSeat   which internal partition this coordinator serves: it loads,
                    serves and drops the coordinator (`Loadable`) as this broker
                    leads its partition or not. Single node: LocalSeat below
                    (this broker leads every partition: it loads the log when
                    started and always serves). Cluster:
                    cluster.coordinator_host.SeatedCoordinator.
  ShareStore        where a cluster keeps share-partition state and share group
                    configs (coordinator.share_leaders); writes fenced by the
                    partition's leader epoch. Cluster: cluster.share_store.
                    EtcdShareStore; a single node keeps them in its share
                    coordinator's log instead.

The cluster implementations satisfy these structurally and do not import this
module (cluster sits beside coordinator, not above it: docs/architecture.md);
tests/unit/coordinator/test_ports.py checks that each still has the shape.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ..protocol.errors import KafkaError
from ..storage.committed import HighWatermarks

__all__ = ["CoordinatorSeat", "HighWatermarks", "Loadable", "LocalMarkers", "LocalSeat", "MarkerWriter",
           "PartitionWriter", "ProducerIdSource", "ShareStore"]


@runtime_checkable
class PartitionWriter(Protocol):
    async def sync(self, plog: Any, upto_offset: int, stamp: int | None = None) -> None:
        """Return once plog's records before `upto_offset` are committed; AppendError
        (or StorageError) when they are not. `stamp`: the append's AppendInfo.fsync_stamp."""


@runtime_checkable
class MarkerWriter(Protocol):
    def leads_here(self, tp: tuple[str, int]) -> bool:
        """Is this broker tp's leader (the marker is written into the local log)?"""

    async def write(self, tp: tuple[str, int], commit: bool, producers: list[tuple[int, int]],
                    coordinator_epoch: int) -> KafkaError:
        """Have tp's leader write the markers of `producers` ((producer id, epoch) each)
        in one append; NONE once they are committed there."""

    def close(self) -> None:
        """Drop connections (the broker stops)."""


class LocalMarkers:
    """The single node's MarkerWriter: every partition is led here, so the coordinator
    writes each marker into its own broker's log and never asks another broker."""

    def leads_here(self, tp: tuple[str, int]) -> bool:
        return True

    async def write(self, tp: tuple[str, int], commit: bool, producers: list[tuple[int, int]],
                    coordinator_epoch: int) -> KafkaError:
        return KafkaError.NOT_LEADER_OR_FOLLOWER    # there is no other broker to write it

    def close(self) -> None:
        pass


@runtime_checkable
class ProducerIdSource(Protocol):
    @property
    def coordinator_epoch(self) -> int:
        """The epoch written into markers while no seat gives one."""

    async def reserve(self, want: int = 2) -> None:
        """Have ids ready so that `next_id` does not wait (awaited before a decision)."""

    def next_id(self) -> int:
        """A producer id never handed out before; StorageError when none can be."""


@runtime_checkable
class Loadable(Protocol):
    """The calls a seat makes on its coordinator; none awaits between reading the log
    and changing memory."""

    def unload(self) -> None: ...

    def load(self, plog: Any, epoch: int | None) -> None: ...

    def serve(self, epoch: int | None) -> None: ...


@runtime_checkable
class CoordinatorSeat(Protocol):
    topic: str
    partition: int

    def start(self, coordinator: Loadable) -> None:
        """Follow the partition's leadership, driving `coordinator`."""

    async def stop(self) -> None: ...

    def error(self) -> KafkaError:
        """NONE while serving, COORDINATOR_LOAD_IN_PROGRESS while loading, else NOT_COORDINATOR."""

    def serving(self) -> bool: ...


class LocalSeat:
    """The single node's CoordinatorSeat: this broker leads every partition, so the seat
    opens its partition's log (creating the internal topic with `configs` at the first
    start), loads the coordinator when started and serves from then on. Its epoch is
    None: the coordinator takes the ProducerIdSource's coordinator epoch."""

    partition = 0

    def __init__(self, logs: Any, topic: str, configs: dict[str, str]):
        self.logs = logs
        self.topic = topic
        self.configs = configs
        self._serving = False

    def start(self, coordinator: Loadable) -> None:
        coordinator.load(self._open(), None)
        self._serving = True
        coordinator.serve(None)

    async def stop(self) -> None:
        self._serving = False

    def error(self) -> KafkaError:
        return KafkaError.NONE if self._serving else KafkaError.COORDINATOR_LOAD_IN_PROGRESS

    def serving(self) -> bool:
        return self._serving

    def _open(self) -> Any:
        if self.logs.get(self.topic, self.partition) is None:
            err = self.logs.create_topic(self.topic, 1, self.configs, internal=True)
            if err not in (KafkaError.NONE, KafkaError.TOPIC_ALREADY_EXISTS):
                raise RuntimeError(f"cannot create {self.topic}: {KafkaError(err).name}")
        plog = self.logs.get(self.topic, self.partition)
        if plog is None:
            raise RuntimeError(f"{self.topic} partition {self.partition} missing after creation")
        return plog


class ShareStore(Protocol):
    """Durable share-group state in a cluster. Keys and values are the share
    coordinator's records (semel.coordinator.share_state)."""

    async def claim(self, topic: str, partition: int, leader_epoch: int) -> KafkaError:
        """Take the share state of a partition this broker leads at `leader_epoch`:
        writes under an older epoch fail from then on. NOT_LEADER_OR_FOLLOWER when a
        newer epoch took it."""
        ...

    async def read(self, key: bytes) -> bytes | None: ...

    async def write(self, pairs: list[tuple[bytes, bytes | None]], fences: dict[tuple[str, int], int]) -> KafkaError:
        """All of `pairs` (None: delete), only while every (topic, partition) of `fences`
        is still claimed at its epoch; NONE once durable."""
        ...
