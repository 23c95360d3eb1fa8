"""The cluster's metadata as etcd holds it: the key schema of one cluster id and the
JSON of each value, decoded into the records the broker works with.

Keys, all under /semel/<cluster-id>/ (values are JSON):

  brokers/<node-id>            {"node_id", "host", "port", "rack", "endpoints"}  bound to the broker's lease
  controller                   {"node_id"}                           bound to the controller's lease
  topics/<name>                {"partitions", "replication_factor", "configs", "topic_id",
                                "deleted", "retired_ids"}            deleted: kept as a marker
  partitions/<topic>/<index>   {"replicas", "leader", "leader_epoch", "isr",
                                "adding", "removing", "origin"}       the last three during a reassignment
  producer_ids                 {"next"}                              the next unallocated producer id
  configs/<name>               {"value"}                             cluster-wide dynamic broker configs
  users/<name>                 SCRAM credentials per mechanism       semel.broker.auth.cluster_store
  acls/<type>/<pattern>/<name> the ACLs of one resource              semel.broker.auth.cluster_store

A partition's `version` (PartitionState.version) is the etcd mod_revision of its key,
and a topic's the mod_revision of topics/<name>: what a compare-and-swap compares.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from .etcd import KV
from .state import PartitionState


@dataclass(frozen=True)
class TopicInfo:
    name: str
    partitions: int
    replication_factor: int
    configs: dict[str, str] = field(default_factory=dict)
    topic_id: str = ""
    version: int = 0                    # mod_revision of topics/<name>: what a CAS compares
    # A deleted topic stays as a marker (its partitions are gone) until the name is
    # created again; the ids the name had before, each deleted, travel with it so a
    # broker that missed a deletion recognises its local logs as stale (ClusterMember).
    deleted: bool = False
    retired_ids: tuple[str, ...] = ()


# Ids of earlier incarnations kept per name: a broker away across more delete/create
# cycles of one name than this keeps the (unrecognised) logs it has.
RETIRED_IDS_KEPT = 256


def encode_topic(info: TopicInfo) -> bytes:
    d = {"partitions": info.partitions, "replication_factor": info.replication_factor,
         "configs": info.configs, "topic_id": info.topic_id}
    if info.deleted:
        d["deleted"] = True
    if info.retired_ids:
        d["retired_ids"] = list(info.retired_ids)
    return json.dumps(d).encode()


def decode_topic(name: str, kv: KV) -> TopicInfo:
    d = json.loads(kv.value)
    return TopicInfo(name, d["partitions"], d["replication_factor"], d.get("configs") or {},
                     d.get("topic_id", ""), kv.mod_revision, bool(d.get("deleted", False)),
                     tuple(d.get("retired_ids") or ()))


# The cluster id a broker, `semel broker` and `semel user|acl --metadata` use when none
# is given: brokers started without one share one cluster's keys.
DEFAULT_CLUSTER_ID = "semel-cluster"


class Keys:
    """The key schema of one cluster id."""

    def __init__(self, cluster_id: str):
        self.root = f"/semel/{cluster_id}/"
        self.brokers = self.root + "brokers/"
        self.controller = self.root + "controller"
        self.topics = self.root + "topics/"
        self.partitions = self.root + "partitions/"
        self.producer_ids = self.root + "producer_ids"
        # Share-group state (semel.cluster.share_store), beside the root, not under it:
        # every broker watches the root, and each acknowledgement would reach them all.
        self.share = f"/semel-share/{cluster_id}/"

    def broker(self, node_id: int) -> str:
        return f"{self.brokers}{node_id}"

    def topic(self, name: str) -> str:
        return self.topics + name

    def partition(self, topic: str, index: int) -> str:
        return f"{self.partitions}{topic}/{index}"


def encode_partition(st: PartitionState) -> bytes:
    d = {"replicas": list(st.replicas), "leader": st.leader, "leader_epoch": st.leader_epoch, "isr": list(st.isr)}
    if st.reassigning:
        d["adding"], d["removing"], d["origin"] = list(st.adding), list(st.removing), list(st.origin)
    return json.dumps(d).encode()


def decode_partition(topic: str, index: int, kv: KV) -> PartitionState:
    d = json.loads(kv.value)
    return PartitionState(topic, index, tuple(d["replicas"]), d["leader"], d["leader_epoch"],
                          tuple(d["isr"]), kv.mod_revision, tuple(d.get("adding") or ()),
                          tuple(d.get("removing") or ()), tuple(d.get("origin") or ()))


class KeyCache:
    """The keys under one prefix of the cluster's root (users/, acls/), as the view's
    watch delivers them: name (the key below the prefix) -> decoded JSON value.
    `version` grows with every change, so readers can rebuild what they derive once per
    change. A write of this broker is applied at once (`put`/`drop` with its revision);
    the watch delivering it later, or anything older, changes nothing."""

    def __init__(self) -> None:
        self.items: dict[str, object] = {}
        self.version = 0
        self._rev: dict[str, int] = {}     # name -> revision of the newest change seen, deletions too

    def apply(self, name: str, kv: KV, deleted: bool) -> None:
        if deleted:
            self.drop(name, kv.mod_revision)
        else:
            self.put(name, json.loads(kv.value), kv.mod_revision)

    def put(self, name: str, value: object, revision: int) -> None:
        if revision > self._rev.get(name, 0):
            self._rev[name] = revision
            self.items[name] = value
            self.version += 1

    def drop(self, name: str, revision: int) -> None:
        if revision > self._rev.get(name, 0):
            self._rev[name] = revision
            if self.items.pop(name, None) is not None:
                self.version += 1

    def reset(self) -> None:
        """Before a fresh range read (the watch broke): deletions may have been missed."""
        self.items.clear()
        self._rev.clear()
        self.version += 1
