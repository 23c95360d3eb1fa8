"""Each implementation semel.broker.wiring hands a coordinator still has the shape of
its interface in semel.coordinator.ports. The cluster implementations do not import
the interfaces (cluster may not import coordinator), so a renamed or dropped method
would otherwise show only when a cluster broker first calls it."""
from __future__ import annotations

from types import SimpleNamespace

from semel.cluster.coordinator_host import SeatedCoordinator
from semel.cluster.producer_ids import ClusterProducerIds
from semel.cluster.replica_manager import ReplicaManager
from semel.cluster.state import MemoryClusterView
from semel.cluster.txn_markers import MarkerChannel
from semel.coordinator.group import GroupCoordinator
from semel.coordinator.ports import (
    CoordinatorSeat, HighWatermarks, Loadable, LocalMarkers, LocalSeat, MarkerWriter, PartitionWriter, ProducerIdSource,
)
from semel.coordinator.producer_ids import ProducerIdManager
from semel.coordinator.txn import TransactionCoordinator
from semel.storage.committed import OneNode, PartitionCommit
from semel.storage.flusher import GroupCommitFlusher


def test_partition_writers():
    assert issubclass(GroupCommitFlusher, PartitionWriter)
    assert issubclass(PartitionCommit, PartitionWriter)


def test_marker_writer_and_high_watermarks():
    assert issubclass(MarkerChannel, MarkerWriter)
    assert issubclass(LocalMarkers, MarkerWriter)
    assert issubclass(ReplicaManager, HighWatermarks)
    assert issubclass(OneNode, HighWatermarks)


def test_producer_id_sources(tmp_path):
    local = ProducerIdManager(tmp_path / "producer_ids")
    assert isinstance(local, ProducerIdSource)
    view = MemoryClusterView(MemoryClusterView.table(), 0)
    assert isinstance(ClusterProducerIds(local, view), ProducerIdSource)


def test_seat_and_what_it_drives():
    view = MemoryClusterView(MemoryClusterView.table(), 0)
    seat = SeatedCoordinator(view, 0, SimpleNamespace(get=lambda topic, partition: None), lambda: None,
                             "__consumer_offsets", 0)
    assert isinstance(seat, CoordinatorSeat)
    assert isinstance(LocalSeat(SimpleNamespace(get=lambda topic, partition: None), "__consumer_offsets", {}),
                      CoordinatorSeat)
    assert issubclass(GroupCoordinator, Loadable)
    assert issubclass(TransactionCoordinator, Loadable)


def test_the_check_can_fail():
    assert not issubclass(GroupCoordinator, MarkerWriter)
    assert not isinstance(object(), CoordinatorSeat)
