"""Coordinators on their own, as a single node builds them (semel.broker.wiring): each on
a LocalSeat, the transaction coordinator given the group coordinators' one shape
(semel.coordinator.partitioned.GroupCoordinators with one part)."""
from __future__ import annotations

from semel.coordinator.partition_markers import PartitionMarkers
from semel.coordinator.partitioned import GroupCoordinators
from semel.coordinator.group import GroupConfig, GroupCoordinator
from semel.coordinator.ports import LocalSeat
from semel.coordinator.txn import TXN_TOPIC, TransactionCoordinator
from semel.storage.committed import Committed, OneNode


def group_coordinator(logs, flusher=None, config: GroupConfig | None = None, clock=None, **kw) -> GroupCoordinator:
    config = config or GroupConfig()
    seat = LocalSeat(logs, config.offsets_topic, GroupCoordinator.log_configs(config))
    return GroupCoordinator(logs, flusher, config, clock, seat=seat, **kw)


def txn_coordinator(logs, flusher, groups: GroupCoordinator, config, pids, **kw) -> TransactionCoordinator:
    seat = LocalSeat(logs, TXN_TOPIC, TransactionCoordinator.log_configs(config))
    one_node = OneNode(lambda topic, partition: None)
    local = PartitionMarkers(logs, Committed(flusher, lambda: one_node, config.request_timeout_ms / 1000))
    return TransactionCoordinator(logs, flusher, GroupCoordinators([groups]), config, pids, seat=seat,
                                  local_markers=local, **kw)


async def start(coordinator) -> None:
    """Start `coordinator` and its seat (the broker starts the seats once replication runs)."""
    await coordinator.start()
    coordinator.seat.start(coordinator)
