"""A consumer group's (KIP-848) records in __consumer_offsets and their one apply
function, used by the live write path and by the start-up replay alike.

Keys are in offsets.py (types 3, 5, 6, 7, 8, numbered as Kafka's). Values, each
int16 value_version 0 first (semel's encoding, like the classic records):

  3 group metadata:     int32 group_epoch, int32 n, n x (string topic, int32 partitions)
  5 member metadata:    nullable string instance_id, nullable string rack_id,
                        string client_id, string client_host, int32 n, n x string topic,
                        nullable string regex, nullable string assignor,
                        int32 rebalance_timeout_ms, then for a member on the classic
                        protocol only: int32 session_timeout_ms, int32 n,
                        n x (string protocol, bytes metadata)
  6 target metadata:    int32 assignment_epoch
  7 target of a member: partitions
  8 current of member:  int32 member_epoch, int32 previous_epoch, int16 state,
                        partitions assigned, partitions revoking
  partitions = int32 n, n x (string topic, int32 m, m x int32 partition)

A null value (tombstone) deletes: the whole group for key 3, the member's entry for
5, 7 and 8. A write is the difference between the group before and after one
transition (`records_between`), in one batch.
"""
from __future__ import annotations

from typing import Iterable

from .consumer_group_rules import ClassicMeta, ConsumerGroup, MemberAssignment, MemberMeta, MemberState, Partitions
from .offsets import (
    KEY_CG_CURRENT_MEMBER, KEY_CG_MEMBER, KEY_CG_METADATA, KEY_CG_TARGET_MEMBER,
    KEY_CG_TARGET_METADATA, ConsumerGroupKey, OffsetsLogError, check_version, RecordReader, RecordWriter,
    consumer_group_key, decode_key,
)

VALUE_VERSION = 0
_STATES = list(MemberState)

Record = tuple[bytes, bytes | None]


def _partitions(w: RecordWriter, parts: Partitions) -> None:
    by_topic: dict[str, list[int]] = {}
    for t, p in parts:
        by_topic.setdefault(t, []).append(p)
    w.i32(len(by_topic))
    for t in sorted(by_topic):
        w.string(t).i32(len(by_topic[t]))
        for p in sorted(by_topic[t]):
            w.i32(p)


def _read_partitions(r: RecordReader) -> Partitions:
    out: set[tuple[str, int]] = set()
    for _ in range(_count(r)):
        topic = r.string() or ""
        out.update((topic, r.i32()) for _ in range(_count(r)))
    return frozenset(out)


def _count(r: RecordReader) -> int:
    n = r.i32()
    if n < 0:
        raise OffsetsLogError("negative count in a consumer group record")
    return n


def metadata_value(g: ConsumerGroup) -> bytes:
    w = RecordWriter().i16(VALUE_VERSION).i32(g.epoch).i32(len(g.topic_counts))
    for t, n in g.topic_counts:
        w.string(t).i32(n)
    return w.done()


def member_value(m: MemberMeta) -> bytes:
    w = (RecordWriter().i16(VALUE_VERSION).string(m.instance_id).string(m.rack_id)
         .string(m.client_id).string(m.client_host).i32(len(m.topics)))
    for t in m.topics:
        w.string(t)
    w.string(m.regex).string(m.assignor).i32(m.rebalance_timeout_ms)
    if m.classic is not None:
        w.i32(m.classic.session_timeout_ms).i32(len(m.classic.protocols))
        for name, meta in m.classic.protocols:
            w.string(name).bytes_(meta)
    return w.done()


def _read_classic(r: RecordReader) -> ClassicMeta | None:
    if r.pos >= len(r.buf):
        return None
    session = r.i32()
    return ClassicMeta(session, tuple((r.string() or "", r.bytes_()) for _ in range(_count(r))))


def target_metadata_value(g: ConsumerGroup) -> bytes:
    return RecordWriter().i16(VALUE_VERSION).i32(g.target_epoch).done()


def target_member_value(parts: Partitions) -> bytes:
    w = RecordWriter().i16(VALUE_VERSION)
    _partitions(w, parts)
    return w.done()


def current_value(a: MemberAssignment) -> bytes:
    w = RecordWriter().i16(VALUE_VERSION).i32(a.epoch).i32(a.previous_epoch).i16(_STATES.index(a.state))
    _partitions(w, a.assigned)
    _partitions(w, a.revoking)
    return w.done()


def records_between(old: ConsumerGroup | None, new: ConsumerGroup | None) -> list[Record]:
    """The records that turn `old` into `new` when applied (every record of `new`
    when `old` is None: a snapshot, as compaction rewrites it)."""
    if new is None:
        if old is None:
            return []
        gid = old.group_id
        out: list[Record] = []
        for mid in old.members:
            out += [(consumer_group_key(k, gid, mid), None)
                    for k in (KEY_CG_CURRENT_MEMBER, KEY_CG_TARGET_MEMBER, KEY_CG_MEMBER)]
        return out + [(consumer_group_key(KEY_CG_TARGET_METADATA, gid), None),
                      (consumer_group_key(KEY_CG_METADATA, gid), None)]
    gid = new.group_id
    before = old if old is not None else ConsumerGroup(gid, epoch=-1, target_epoch=-1)
    out = []
    for mid in before.members.keys() - new.members.keys():
        out += [(consumer_group_key(k, gid, mid), None)
                for k in (KEY_CG_CURRENT_MEMBER, KEY_CG_TARGET_MEMBER, KEY_CG_MEMBER)]
    for mid, meta in new.members.items():
        if before.members.get(mid) != meta:
            out.append((consumer_group_key(KEY_CG_MEMBER, gid, mid), member_value(meta)))
    if (before.epoch, before.topic_counts) != (new.epoch, new.topic_counts):
        out.append((consumer_group_key(KEY_CG_METADATA, gid), metadata_value(new)))
    for mid, parts in new.target.items():
        if mid not in before.target or before.target[mid] != parts:
            out.append((consumer_group_key(KEY_CG_TARGET_MEMBER, gid, mid), target_member_value(parts)))
    for mid in before.target.keys() - new.target.keys() - (before.members.keys() - new.members.keys()):
        out.append((consumer_group_key(KEY_CG_TARGET_MEMBER, gid, mid), None))
    if before.target_epoch != new.target_epoch:
        out.append((consumer_group_key(KEY_CG_TARGET_METADATA, gid), target_metadata_value(new)))
    for mid, a in new.current.items():
        if before.current.get(mid) != a:
            out.append((consumer_group_key(KEY_CG_CURRENT_MEMBER, gid, mid), current_value(a)))
    return out


def apply_records(groups: dict[str, ConsumerGroup], records: Iterable[Record]) -> None:
    """Records of records_between into `groups`, once written."""
    for raw, value in records:
        key = decode_key(raw)
        if not isinstance(key, ConsumerGroupKey):
            raise OffsetsLogError("a consumer group's records hold another kind of key")
        apply_record(groups, key, value)


def _member_id(key: ConsumerGroupKey) -> str:
    """The member a member record is about (its key always names one)."""
    if key.member_id is None:
        raise OffsetsLogError(f"a member record of consumer group {key.group!r} names no member")
    return key.member_id


def apply_record(groups: dict[str, ConsumerGroup], key: ConsumerGroupKey, value: bytes | None) -> None:
    """One record into `groups` (the coordinator's consumer groups by id)."""
    gid = key.group
    if key.kind == KEY_CG_METADATA and value is None:
        groups.pop(gid, None)
        return
    g = groups.get(gid)
    if g is None:
        if value is None:
            return
        g = groups[gid] = ConsumerGroup(gid)
    if value is None:
        if key.kind == KEY_CG_MEMBER:
            g.members.pop(_member_id(key), None)
        elif key.kind == KEY_CG_TARGET_MEMBER:
            g.target.pop(_member_id(key), None)
        elif key.kind == KEY_CG_CURRENT_MEMBER:
            g.current.pop(_member_id(key), None)
        return
    r = RecordReader(value)
    check_version(r)
    if key.kind == KEY_CG_METADATA:
        g.epoch = r.i32()
        g.topic_counts = tuple((r.string() or "", r.i32()) for _ in range(_count(r)))
    elif key.kind == KEY_CG_MEMBER:
        mid = _member_id(key)
        instance, rack, client_id, host = r.string(), r.string(), r.string(), r.string()
        topics = tuple(r.string() or "" for _ in range(_count(r)))
        regex, assignor, rebalance = r.string(), r.string(), r.i32()
        g.members[mid] = MemberMeta(mid, instance, rack, client_id or "", host or "", topics,
                                    regex, assignor, rebalance, _read_classic(r))
    elif key.kind == KEY_CG_TARGET_METADATA:
        g.target_epoch = r.i32()
    elif key.kind == KEY_CG_TARGET_MEMBER:
        g.target[_member_id(key)] = _read_partitions(r)
    elif key.kind == KEY_CG_CURRENT_MEMBER:
        epoch, previous, state = r.i32(), r.i32(), r.i16()
        if not 0 <= state < len(_STATES):
            raise OffsetsLogError(f"unknown member state {state}")
        g.current[_member_id(key)] = MemberAssignment(epoch, previous, _STATES[state],
                                                      _read_partitions(r), _read_partitions(r))
