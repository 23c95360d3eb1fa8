"""The share coordinator's shard: share groups (members, their assignment, share
sessions), the group configs, and every share-partition. Plain Python, no asyncio:
each operation takes the request and `now`, changes memory, and returns the records
that make the change durable with its answer. What is durable (configs, each
share-partition's window, state and delivery counts) is rebuilt by `replay`; members,
sessions and acquisition locks are soft state, as in Kafka: a member that finds the
coordinator restarted joins again, and what it held is delivered again.

Records (key and value JSON, on the coordinator's own internal topic):
  {"k": "config", "g": group}                        -> {name: value, ...} | null
  {"k": "partition", "g": group, "t": topic, "p": n} -> {"start", "end", "runs"} | null
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..protocol import records as rb
from ..protocol.errors import KafkaError
from ..protocol.records import BatchHeader
from .share_assignor import assign
from .share_partition import Limits, SharePartition

Pair = tuple[bytes, bytes | None]
TP = tuple[str, int]
# Share sessions a broker keeps open at once (Kafka's group.share.max.share.sessions).
MAX_SESSIONS = 2000

# Group configs a user sets on a GROUP resource: name -> (default, check, what it takes).
ISOLATION = ("read_uncommitted", "read_committed")
RESETS = ("latest", "earliest")


def _int_in(lo: int, hi: int) -> Any:
    def check(v: str) -> bool:
        return v.lstrip("-").isdigit() and lo <= int(v) <= hi
    return check


GROUP_CONFIGS: dict[str, tuple[str, Any, str]] = {
    "share.auto.offset.reset": ("latest", RESETS.__contains__, "latest or earliest"),
    "share.record.lock.duration.ms": ("30000", _int_in(1000, 3_600_000), "an integer from 1000 to 3600000"),
    "share.delivery.count.limit": ("5", _int_in(2, 10), "an integer from 2 to 10"),
    "share.isolation.level": ("read_uncommitted", ISOLATION.__contains__, "read_uncommitted or read_committed"),
    "share.partition.max.record.locks": ("2000", _int_in(100, 10_000), "an integer from 100 to 10000"),
    "share.heartbeat.interval.ms": ("5000", _int_in(1000, 60_000), "an integer from 1000 to 60000"),
    "share.session.timeout.ms": ("45000", _int_in(1000, 600_000), "an integer from 1000 to 600000"),
}


def check_group_config(name: str, value: str | None) -> str | None:
    """Why `name`=`value` is refused (None: accepted; a None value resets to the default)."""
    known = GROUP_CONFIGS.get(name)
    if known is None:
        return f"unknown group config {name!r}"
    if value is not None and not known[1](value):
        return f"{name} must be {known[2]}, not {value!r}"
    return None


@dataclass
class ShareMember:
    member_id: str
    epoch: int
    topics: tuple[str, ...]
    last_seen: int
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    assigned: list[TP] | None = None   # the assignor's current answer for it
    sent: list[TP] | None = None       # the assignment its member epoch stands for


@dataclass
class ShareGroup:
    group_id: str
    epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)
    # What the assignment was computed for: (group epoch, partition counts of its topics).
    assigned_for: tuple[object, ...] | None = None


@dataclass
class Session:
    next_epoch: int
    partitions: set[TP] = field(default_factory=set)


@dataclass(frozen=True)
class HeartbeatAnswer:
    error: KafkaError
    member_id: str
    epoch: int
    assignment: list[TP] | None
    interval_ms: int
    message: str | None = None


def _key(**kw: Any) -> bytes:
    return json.dumps(kw, sort_keys=True, separators=(",", ":")).encode()


def partition_key(group_id: str, topic: str, p: int) -> bytes:
    """The key of a share-partition's record."""
    return _key(k="partition", g=group_id, t=topic, p=p)


def config_key(group_id: str) -> bytes:
    """The key of a share group's config record."""
    return _key(k="config", g=group_id)


class ShareState:
    def __init__(self) -> None:
        self.configs: dict[str, dict[str, str]] = {}
        self.partitions: dict[tuple[str, str, int], SharePartition] = {}
        self.groups: dict[str, ShareGroup] = {}
        self.sessions: dict[tuple[str, str], Session] = {}

    # --- the runtime's shard -------------------------------------------------------------

    def clear(self) -> None:
        self.configs.clear()
        self.partitions.clear()
        self.groups.clear()
        self.sessions.clear()

    def replay(self, buf: bytes | memoryview, pos: int, hdr: BatchHeader) -> None:
        if hdr.is_control:
            return
        for rec in rb.iter_records(buf, pos):
            if rec.key is not None:
                self.apply(rec.key, rec.value)

    def apply(self, key_raw: bytes, value_raw: bytes | None) -> None:
        """One record into memory (the start-up replay; the write path changes memory
        as it decides, and writes what `partition_record` and `set_configs` return)."""
        key = json.loads(key_raw)
        value = None if value_raw is None else json.loads(value_raw)
        if key.get("k") == "config":
            if value is None:
                self.configs.pop(key["g"], None)
            else:
                self.configs[key["g"]] = {str(k): str(v) for k, v in value.items()}
        elif key.get("k") == "partition":
            spk = (key["g"], key["t"], int(key["p"]))
            if value is None:
                self.partitions.pop(spk, None)
            else:   # the newest record of a share-partition is its state
                self.partitions[spk] = SharePartition.restore(
                    value["start"], value["end"], [tuple(r) for r in value["runs"]])

    # --- configs ---------------------------------------------------------------------------

    def config(self, group_id: str, name: str) -> str:
        return self.configs.get(group_id, {}).get(name, GROUP_CONFIGS[name][0])

    def limits(self, group_id: str) -> Limits:
        return Limits(lock_ms=int(self.config(group_id, "share.record.lock.duration.ms")),
                      delivery_limit=int(self.config(group_id, "share.delivery.count.limit")),
                      max_in_flight=int(self.config(group_id, "share.partition.max.record.locks")))

    def set_configs(self, group_id: str, values: Mapping[str, str]) -> list[Pair]:
        """The record that makes `values` (the group's whole set of overrides) durable."""
        self.configs[group_id] = dict(values)
        return [(config_key(group_id), json.dumps(dict(values)).encode() if values else None)]

    # --- share-partitions ---------------------------------------------------------------

    def partition(self, group_id: str, topic: str, p: int) -> SharePartition | None:
        return self.partitions.get((group_id, topic, p))

    def init_partition(self, group_id: str, topic: str, p: int, start: int) -> SharePartition:
        sp = self.partitions[(group_id, topic, p)] = SharePartition(start)
        return sp

    def partition_record(self, group_id: str, topic: str, p: int) -> Pair:
        sp = self.partitions[(group_id, topic, p)]
        start, end, runs = sp.durable(self.limits(group_id))
        return (partition_key(group_id, topic, p),
                json.dumps({"start": start, "end": end, "runs": runs}).encode())

    def snapshot(self) -> list[Pair]:
        """Every live record as it stands (what a compaction rewrites)."""
        out = [(config_key(g), json.dumps(v).encode()) for g, v in sorted(self.configs.items()) if v]
        return out + [self.partition_record(g, t, p) for g, t, p in sorted(self.partitions)]

    def drop_group(self, group_id: str) -> list[Pair]:
        """Forget a share group with no members: tombstones for its configs and partitions."""
        out: list[Pair] = [(config_key(group_id), None)] if group_id in self.configs else []
        for g, t, p in [k for k in self.partitions if k[0] == group_id]:
            del self.partitions[(g, t, p)]
            out.append((partition_key(g, t, p), None))
        self.configs.pop(group_id, None)
        self.groups.pop(group_id, None)
        return out

    def drop_topic(self, group_id: str, topic: str) -> list[Pair]:
        """Forget the group's share-partitions of `topic`: tombstones for each (its next
        read starts again where share.auto.offset.reset says)."""
        out: list[Pair] = []
        for g, t, p in [k for k in self.partitions if k[0] == group_id and k[1] == topic]:
            del self.partitions[(g, t, p)]
            out.append((_key(k="partition", g=g, t=t, p=p), None))
        return out

    # --- members -------------------------------------------------------------------------

    def heartbeat(self, group_id: str, member_id: str, epoch: int, topics: tuple[str, ...] | None,
                  rack_id: str | None, partition_counts: Mapping[str, int], now: int,
                  client: tuple[str, str] = ("", "")) -> HeartbeatAnswer:
        """One ShareGroupHeartbeat; `client` is (client id, client host), kept for describe."""
        interval = int(self.config(group_id, "share.heartbeat.interval.ms"))
        self.expire_members(group_id, now)
        if not member_id or not group_id:
            return HeartbeatAnswer(KafkaError.INVALID_REQUEST, member_id, -1, None, 0,
                                   "GroupId and MemberId are required")
        if epoch == 0 and topics is None:
            return HeartbeatAnswer(KafkaError.INVALID_REQUEST, member_id, -1, None, 0,
                                   "SubscribedTopicNames is required when joining")
        if epoch != 0 and group_id not in self.groups:
            return HeartbeatAnswer(KafkaError.UNKNOWN_MEMBER_ID, member_id, -1, None, 0)
        group = self.groups.setdefault(group_id, ShareGroup(group_id))
        if epoch == -1:
            # Its share sessions close on their own (a client closes them as it leaves,
            # acknowledging what it read): what they hold stays theirs until then.
            self.leave(group_id, member_id, release=False)
            return HeartbeatAnswer(KafkaError.NONE, member_id, -1, None, interval)
        m = group.members.get(member_id)
        if epoch == 0 and topics is not None:
            group.epoch += 1
            m = group.members[member_id] = ShareMember(member_id, group.epoch, topics, now, rack_id, *client)
        elif m is None:
            return HeartbeatAnswer(KafkaError.UNKNOWN_MEMBER_ID, member_id, -1, None, 0)
        elif epoch != m.epoch:
            return HeartbeatAnswer(KafkaError.FENCED_MEMBER_EPOCH, member_id, -1, None, 0)
        else:
            m.last_seen = now
            if topics is not None and tuple(topics) != m.topics:
                group.epoch += 1
                m.topics, m.epoch = tuple(topics), group.epoch
        self.rebalance(group, partition_counts)
        if m.assigned != m.sent:   # a new assignment: the member's epoch moves to the group's
            m.epoch, m.sent = group.epoch, m.assigned
        return HeartbeatAnswer(KafkaError.NONE, member_id, m.epoch, self.assignment(m, partition_counts), interval)

    @staticmethod
    def rebalance(group: ShareGroup, partition_counts: Mapping[str, int]) -> None:
        """Compute the members' assignment again (share_assignor) once the members, their
        subscriptions or the partition counts changed."""
        topics = sorted({t for m in group.members.values() for t in m.topics})
        key = (group.epoch, tuple((t, partition_counts.get(t, 0)) for t in topics))
        if key == group.assigned_for:
            return
        group.assigned_for = key
        plan = assign({mid: m.topics for mid, m in group.members.items()}, partition_counts,
                      {mid: m.assigned or [] for mid, m in group.members.items()})
        for mid, m in group.members.items():
            m.assigned = plan[mid]

    @staticmethod
    def assignment(m: ShareMember, partition_counts: Mapping[str, int]) -> list[TP]:
        """The member's partitions as the simple assignor last gave them (balance, then
        stickiness: several members share a partition only when they outnumber the
        partitions); which record goes to whom is decided one acquisition at a time.
        Before its first assignment: every partition of its topics."""
        if m.assigned is not None:
            return list(m.assigned)
        return [(t, p) for t in sorted(set(m.topics)) for p in range(partition_counts.get(t, 0))]

    def leave(self, group_id: str, member_id: str, *, release: bool = True) -> None:
        """The member is gone; with `release` (its session timed out) its share sessions
        close and what it held is available again."""
        group = self.groups.get(group_id)
        if group is not None and group.members.pop(member_id, None) is not None:
            group.epoch += 1
        if not release:
            return
        self.sessions.pop((group_id, member_id), None)
        for (g, _, _), sp in self.partitions.items():
            if g == group_id:
                sp.release_member(member_id, self.limits(group_id))

    def expire_members(self, group_id: str, now: int) -> None:
        group = self.groups.get(group_id)
        if group is None:
            return
        timeout = int(self.config(group_id, "share.session.timeout.ms"))
        for mid in [mid for mid, m in group.members.items() if now - m.last_seen > timeout]:
            self.leave(group_id, mid)

    def is_member(self, group_id: str, member_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is not None and member_id in group.members

    # --- share sessions ---------------------------------------------------------------

    def open_session(self, group_id: str, member_id: str, epoch: int,
                     add: set[TP], forget: set[TP]) -> tuple[KafkaError, Session | None]:
        """Check the ShareSessionEpoch: 0 opens a session (the next request says 1), a
        positive one must be the next of its session, -1 closes it (after this request)."""
        key = (group_id, member_id)
        if epoch == 0:
            if key in self.sessions:   # a new session: what the old one held goes back
                self.release_session(group_id, member_id)
            elif len(self.sessions) >= MAX_SESSIONS:
                return KafkaError.SHARE_SESSION_LIMIT_REACHED, None
            session = self.sessions[key] = Session(1, set(add))
            return KafkaError.NONE, session
        found = self.sessions.get(key)
        if found is None:
            return KafkaError.SHARE_SESSION_NOT_FOUND, None
        if epoch != -1:
            if epoch != found.next_epoch:
                return KafkaError.INVALID_SHARE_SESSION_EPOCH, None
            found.next_epoch += 1
        found.partitions |= add
        found.partitions -= forget
        return KafkaError.NONE, found

    def release_session(self, group_id: str, member_id: str) -> list[tuple[str, str, int]]:
        """Close the member's session: the records it holds are available again.
        Returns the share-partitions changed."""
        self.sessions.pop((group_id, member_id), None)
        changed = []
        for (g, t, p), sp in self.partitions.items():
            if g == group_id and sp.release_member(member_id, self.limits(group_id)):
                changed.append((g, t, p))
        return changed

    def group_partitions(self, group_id: str) -> list[tuple[str, int, SharePartition]]:
        return sorted(((t, p, sp) for (g, t, p), sp in self.partitions.items() if g == group_id),
                      key=lambda x: (x[0], x[1]))
