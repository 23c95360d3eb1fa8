"""A broker's local logs follow the cluster's topics: created when a topic appears in
etcd, grown when it gains partitions, removed when it is deleted.

Every broker keeps logs for every partition of every topic (so it can become a replica
or leader without another round trip). A deleted topic leaves a marker in etcd
(EtcdClusterView.deleted_topics) and a topic created again under the same name gets a
new id and carries the ids the name had before (`retired_ids`). Local logs carry the
cluster's topic id (LogManager.create_topic(topic_id=...)), so a broker that was away
while a topic was deleted, or deleted and created again, recognises its logs as stale
and drops them instead of serving their records as the new topic's.

The decision is the pure `plan`; `sync_local_topics` carries it out.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from typing import TYPE_CHECKING, Mapping

from ..protocol.errors import KafkaError

if TYPE_CHECKING:
    from ..storage.manager import LogManager, TopicInfo as LocalTopic
    from .keys import TopicInfo
    from .metadata import ClusterMetadata
    from .replica_manager import ReplicaManager

log = logging.getLogger("semel.cluster.topic_sync")


def is_internal(name: str) -> bool:
    """The coordinators' topics: never dropped or grown here (they cannot be deleted)."""
    return name.startswith("__")


@dataclass
class Plan:
    drop: list[str] = field(default_factory=list)            # local topics to remove
    create: list[TopicInfo] = field(default_factory=list)              # cluster TopicInfos to create locally
    grow: list[tuple[str, int]] = field(default_factory=list)   # (name, new partition count)


def plan(local: dict[str, LocalTopic], live: dict[str, TopicInfo],
         deleted: Mapping[str, object]) -> Plan:
    """What to do to the local logs. `local`: name -> storage TopicInfo (topic_id,
    partitions); `live` / `deleted`: the cluster view's topics and deletion markers.

    Drop a local topic whose name the cluster has deleted, or whose id is one the name
    had before (retired): it holds an earlier incarnation's records. A local topic the
    cluster never had is left alone (nothing in a cluster creates one; a data directory
    from before is not ours to judge). Create what the cluster has and this broker does
    not (again, after a drop); grow what has fewer partitions here."""
    out = Plan()
    for name, loc in local.items():
        if is_internal(name):
            continue
        if name in deleted and name not in live:
            out.drop.append(name)
        elif name in live and loc.topic_id in live[name].retired_ids:
            out.drop.append(name)
    for name, info in live.items():
        here = local.get(name)
        if here is None or name in out.drop:
            out.create.append(info)
        elif here.partitions < info.partitions and not is_internal(name):
            out.grow.append((name, info.partitions))
    return out


def deleted_names(view: ClusterMetadata) -> set[str]:
    """Topics the cluster holds deleted: a deletion marker, not created again since."""
    live = view.topics()
    return {name for name in view.deleted_topics() if name not in live}


def sync_local_topics(logs: LogManager, replicas: ReplicaManager | None, view: ClusterMetadata) -> None:
    """Apply `plan` to `logs` (the LogManager); the replication data plane (`replicas`,
    None before it runs) forgets a dropped topic's partitions first (no role, no
    fetcher, no saved high watermark) and takes its roles for created or added
    partitions after."""
    local = logs.topics()
    todo = plan(local, view.topics(), view.deleted_topics())
    for name in todo.drop:
        if replicas is not None:
            for p in range(local[name].partitions):
                replicas.forget(name, p)
        err = logs.delete_topic(name)
        log.info("topic %s deleted in the cluster: local logs removed (%s)", name, err.name)
    for info in todo.create:
        err = logs.create_topic(info.name, info.partitions, dict(info.configs), internal=is_internal(info.name),
                                topic_id=info.topic_id or None)
        if err not in (KafkaError.NONE, KafkaError.TOPIC_ALREADY_EXISTS):
            log.error("cannot create local logs of %s: %s %s", info.name, err.name, logs.last_error_message)
    for name, count in todo.grow:
        err = logs.create_partitions(name, count)
        if err is not KafkaError.NONE:
            log.error("cannot add local partitions to %s: %s %s", name, err.name, logs.last_error_message)
    if (todo.create or todo.grow) and replicas is not None:
        # The partitions' states reached the replication data plane before their logs
        # existed (one etcd transaction carries both): let it take its roles now.
        replicas.resync()
