"""This broker's replicas of its partitions, as the data-plane handlers ask about them.

Produce, Fetch, ListOffsets, OffsetForLeaderEpoch and WriteTxnMarkers ask the same
questions on a single node as in a cluster: may this broker serve the partition as its
leader at the client's leader epoch, may a batch be appended, what a follower's fetch
records and may read, where a leader epoch ends, which partitions are led here. In a
cluster `semel.cluster.replica_manager.ReplicaManager` answers; on a single node
`NodeReplicas`, a cluster of one: this node leads every partition at LEADER_EPOCH, is
its only replica and in-sync replica, has no follower and nothing to throttle. Kafka's
epoch fencing (KIP-320) applies to both.
"""
from __future__ import annotations

from typing import Iterator, Protocol

from ..cluster.replica_rules import UNDEFINED, append_error, leader_epoch_error, min_insync_of
from ..cluster.state import PartitionState
from ..protocol.errors import KafkaError
from ..storage.log import PartitionLog
from ..storage.manager import TopicInfo
from .node_view import LEADER_EPOCH

UNLIMITED = -1   # throttle_allowance: no throttle on this fetch


class LocalReplicas(Protocol):
    """What the handlers ask of this broker's replicas (`Services.replicas`)."""

    def leader_error(self, topic: str, partition: int, current_leader_epoch: int = -1) -> KafkaError:
        """NONE when this broker may serve the partition as its leader at the asker's
        epoch (-1: any); else UNKNOWN_TOPIC_OR_PARTITION, FENCED_LEADER_EPOCH,
        UNKNOWN_LEADER_EPOCH or NOT_LEADER_OR_FOLLOWER, in Kafka's order."""
        ...

    def before_append(self, topic: str, partition: int, acks: int) -> KafkaError:
        """Produce, before anything is written: led here, and for acks=all enough
        in-sync replicas."""
        ...

    def min_insync(self, topic: str) -> int:
        """The topic's min.insync.replicas (its own config, else the broker's default)."""
        ...

    def replica_fetch(self, topic: str, partition: int, replica_id: int, fetch_offset: int,
                      current_leader_epoch: int, last_fetched_epoch: int = UNDEFINED
                      ) -> KafkaError | tuple[int, int]:
        """A follower's fetch of one partition: NONE (its progress recorded), an error,
        or (epoch, end offset) where its log diverged from the leader's."""
        ...

    def throttle_allowance(self, topic: str, partition: int, replica_id: int) -> int:
        """Bytes the fetch of `replica_id` may read from the partition now; -1 unlimited."""
        ...

    def spend(self, size: int) -> None:
        """A throttled fetch read `size` bytes."""
        ...

    def epoch_end(self, topic: str, partition: int, current_leader_epoch: int,
                  leader_epoch: int) -> tuple[KafkaError, int, int]:
        """OffsetForLeaderEpoch: (error, epoch, end offset), the largest epoch at or below
        `leader_epoch` and where it ends; (NONE, -1, -1) when there is none."""
        ...

    def led(self) -> list[PartitionState]:
        """The partitions this broker leads, with their replicas and ISR."""
        ...


class OpenLogs(Protocol):
    """What NodeReplicas reads of the broker's logs (semel.storage.manager.LogManager)."""

    def get(self, topic: str, partition: int) -> PartitionLog | None: ...

    def all_logs(self) -> Iterator[tuple[tuple[str, int], PartitionLog]]: ...

    def topic(self, name: str) -> TopicInfo | None: ...


class NoLogs:
    """A broker's logs before it opened them: no partition."""

    def get(self, topic: str, partition: int) -> PartitionLog | None:
        return None

    def all_logs(self) -> Iterator[tuple[tuple[str, int], PartitionLog]]:
        return iter(())

    def topic(self, name: str) -> TopicInfo | None:
        return None


class NodeReplicas:
    """The cluster of one: every partition of `logs` led here at LEADER_EPOCH, with this
    node its only replica and in-sync replica."""

    def __init__(self, node_id: int, logs: OpenLogs, min_insync_default: int = 1):
        self.node_id = node_id
        self.logs = logs
        self.min_insync_default = min_insync_default   # the broker's min.insync.replicas

    def leader_error(self, topic: str, partition: int, current_leader_epoch: int = -1) -> KafkaError:
        if self.logs.get(topic, partition) is None:
            return KafkaError.UNKNOWN_TOPIC_OR_PARTITION
        return leader_epoch_error(current_leader_epoch, LEADER_EPOCH)

    def before_append(self, topic: str, partition: int, acks: int) -> KafkaError:
        """Led here, and for acks=all an ISR of one is enough: a topic asking for more
        in-sync replicas (min.insync.replicas above 1) refuses acks=all writes with
        NOT_ENOUGH_REPLICAS, as a Kafka leader alone in its ISR does."""
        return self.leader_error(topic, partition) or append_error(acks, 1, self.min_insync(topic))

    def min_insync(self, topic: str) -> int:
        info = self.logs.topic(topic)
        return min_insync_of(info.config if info is not None else None, self.min_insync_default)

    def replica_fetch(self, topic: str, partition: int, replica_id: int, fetch_offset: int,
                      current_leader_epoch: int, last_fetched_epoch: int = UNDEFINED
                      ) -> KafkaError | tuple[int, int]:
        """No broker follows this node: a fetch naming a replica is refused as a leader
        refuses one from a broker outside the partition's replicas."""
        err = self.leader_error(topic, partition, current_leader_epoch)
        return err or KafkaError.NOT_LEADER_OR_FOLLOWER

    def throttle_allowance(self, topic: str, partition: int, replica_id: int) -> int:
        return UNLIMITED   # no reassignment adds a replica here

    def spend(self, size: int) -> None:
        """Nothing is throttled."""

    def epoch_end(self, topic: str, partition: int, current_leader_epoch: int,
                  leader_epoch: int) -> tuple[KafkaError, int, int]:
        """One epoch, LEADER_EPOCH, ending at the log end; no other epoch is in the log
        (undefined, without an error, as Kafka answers)."""
        err = self.leader_error(topic, partition, current_leader_epoch)
        plog = self.logs.get(topic, partition)
        if err or plog is None:
            return err or KafkaError.UNKNOWN_TOPIC_OR_PARTITION, UNDEFINED, UNDEFINED
        if leader_epoch != LEADER_EPOCH:
            return KafkaError.NONE, UNDEFINED, UNDEFINED
        return KafkaError.NONE, LEADER_EPOCH, plog.log_end_offset

    def led(self) -> list[PartitionState]:
        me = (self.node_id,)
        return [PartitionState(topic, partition, me, self.node_id, LEADER_EPOCH, me)
                for (topic, partition), _ in self.logs.all_logs()]


# A broker before its logs are open leads nothing, whatever its node id.
NOTHING_LED = NodeReplicas(-1, NoLogs())
