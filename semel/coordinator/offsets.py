"""Committed offsets: their records in `__consumer_offsets` and their memory.

Record format (semel's own, versioned; Kafka's tools cannot read it and need not):

  key   = int16 key_type, then
          key_type 1 (offset):  string group, string topic, int32 partition
          key_type 2 (group):   string group
          key_types 3-8: a consumer group of the KIP-848 protocol, numbered as
                Kafka numbers these records (consumer_records.py has their values):
                3 group metadata, 5 member metadata, 6 target assignment metadata,
                7 target assignment of a member, 8 current assignment of a member;
                string group, then (5, 7, 8) string member_id
  value = null for a tombstone (the key is deleted), else int16 value_version, then
          offset v0: int64 offset, int32 leader_epoch, nullable string metadata,
                     int64 commit_timestamp_ms
          group  v0: nullable string protocol_type, int32 generation,
                     nullable string protocol, nullable string leader,
                     int64 state_timestamp_ms, int32 member_count, members:
                       string member_id, nullable string group_instance_id,
                       string client_id, string client_host,
                       int32 rebalance_timeout_ms, int32 session_timeout_ms,
                       bytes subscription, bytes assignment

Strings are int16 length + UTF-8 (-1 = null), bytes are int32 length + raw.
A reader that meets a key type or value version it does not know refuses to
load (raising `OffsetsLogError`) instead of silently dropping committed offsets.

In memory every value remembers the log position it was written at, so that
"the later write wins" is decided by log order, exactly as a replay decides it,
whatever order the in-process completions run in.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple

from ..protocol.records import BatchHeader, iter_batches
from ..storage.log import PartitionLog

KEY_OFFSET = 1
KEY_GROUP = 2
KEY_CG_METADATA = 3
KEY_CG_MEMBER = 5
KEY_CG_TARGET_METADATA = 6
KEY_CG_TARGET_MEMBER = 7
KEY_CG_CURRENT_MEMBER = 8
CONSUMER_GROUP_KEYS = (KEY_CG_METADATA, KEY_CG_MEMBER, KEY_CG_TARGET_METADATA,
                       KEY_CG_TARGET_MEMBER, KEY_CG_CURRENT_MEMBER)
_MEMBER_KEYS = (KEY_CG_MEMBER, KEY_CG_TARGET_MEMBER, KEY_CG_CURRENT_MEMBER)
VALUE_VERSION = 0

TopicPartition = tuple[str, int]

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class OffsetsLogError(Exception):
    """A record of __consumer_offsets that this version cannot read."""


# --- primitive codec ----------------------------------------------------------------

class RecordWriter:
    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def i16(self, v: int) -> "RecordWriter":
        self.buf += _I16.pack(v)
        return self

    def i32(self, v: int) -> "RecordWriter":
        self.buf += _I32.pack(v)
        return self

    def i64(self, v: int) -> "RecordWriter":
        self.buf += _I64.pack(v)
        return self

    def string(self, s: str | None) -> "RecordWriter":
        if s is None:
            return self.i16(-1)
        raw = s.encode("utf-8")
        if len(raw) > 0x7FFF:
            raise ValueError("string longer than 32767 bytes")
        self.i16(len(raw))
        self.buf += raw
        return self

    def bytes_(self, b: bytes | None) -> "RecordWriter":
        b = b or b""
        self.i32(len(b))
        self.buf += b
        return self

    def done(self) -> bytes:
        return bytes(self.buf)


class RecordReader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise OffsetsLogError("record shorter than its fields")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def i16(self) -> int:
        value: int = _I16.unpack(self._take(2))[0]
        return value

    def i32(self) -> int:
        value: int = _I32.unpack(self._take(4))[0]
        return value

    def i64(self) -> int:
        value: int = _I64.unpack(self._take(8))[0]
        return value

    def string(self) -> str | None:
        n = self.i16()
        if n == -1:
            return None
        try:
            return self._take(n).decode("utf-8")
        except UnicodeDecodeError:
            raise OffsetsLogError("string is not UTF-8") from None

    def bytes_(self) -> bytes:
        return bytes(self._take(self.i32()))


# --- values -------------------------------------------------------------------------

class CommittedOffset(NamedTuple):
    """One partition's committed position (a tuple: many of these live in memory)."""
    offset: int
    leader_epoch: int = -1
    metadata: str | None = ""
    commit_ts: int = 0
    log_offset: int = -1   # where this value sits in __consumer_offsets; later wins


@dataclass(slots=True)
class MemberRecord:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(slots=True)
class GroupRecord:
    protocol_type: str | None
    generation: int
    protocol: str | None
    leader: str | None
    state_ts: int
    members: list[MemberRecord] = field(default_factory=list)


# --- encoding -------------------------------------------------------------------------

def offset_key(group: str, topic: str, partition: int) -> bytes:
    return RecordWriter().i16(KEY_OFFSET).string(group).string(topic).i32(partition).done()


def group_key(group: str) -> bytes:
    return RecordWriter().i16(KEY_GROUP).string(group).done()


def consumer_group_key(kind: int, group: str, member_id: str | None = None) -> bytes:
    w = RecordWriter().i16(kind).string(group)
    if kind in _MEMBER_KEYS:
        w.string(member_id or "")
    return w.done()


def offset_value(value: CommittedOffset) -> bytes:
    return (RecordWriter().i16(VALUE_VERSION).i64(value.offset).i32(value.leader_epoch)
            .string(value.metadata).i64(value.commit_ts).done())


def group_value(rec: GroupRecord) -> bytes:
    w = (RecordWriter().i16(VALUE_VERSION).string(rec.protocol_type).i32(rec.generation)
         .string(rec.protocol).string(rec.leader).i64(rec.state_ts).i32(len(rec.members)))
    for m in rec.members:
        (w.string(m.member_id).string(m.group_instance_id).string(m.client_id).string(m.client_host)
         .i32(m.rebalance_timeout_ms).i32(m.session_timeout_ms)
         .bytes_(m.subscription).bytes_(m.assignment))
    return w.done()


# --- decoding -------------------------------------------------------------------------

class OffsetKey(NamedTuple):
    group: str
    topic: str
    partition: int


class GroupKey(NamedTuple):
    group: str


class ConsumerGroupKey(NamedTuple):
    kind: int
    group: str
    member_id: str | None


def decode_key(raw: bytes | None) -> OffsetKey | GroupKey | ConsumerGroupKey:
    if raw is None:
        raise OffsetsLogError("record without a key")
    r = RecordReader(raw)
    kind = r.i16()
    if kind == KEY_OFFSET:
        group, topic, part = r.string(), r.string(), r.i32()
        if group is None or topic is None:
            raise OffsetsLogError("offset key with a null name")
        return OffsetKey(group, topic, part)
    if kind == KEY_GROUP:
        group = r.string()
        if group is None:
            raise OffsetsLogError("group key with a null name")
        return GroupKey(group)
    if kind in CONSUMER_GROUP_KEYS:
        group = r.string()
        member = r.string() if kind in _MEMBER_KEYS else None
        if group is None or (kind in _MEMBER_KEYS and member is None):
            raise OffsetsLogError("consumer group key with a null name")
        return ConsumerGroupKey(kind, group, member)
    raise OffsetsLogError(f"unknown key type {kind} (written by a newer semel?)")


def check_version(r: RecordReader) -> None:
    version = r.i16()
    if version != VALUE_VERSION:
        raise OffsetsLogError(f"unknown value version {version} (written by a newer semel?)")


def decode_offset_value(raw: bytes, log_offset: int) -> CommittedOffset:
    r = RecordReader(raw)
    check_version(r)
    return CommittedOffset(r.i64(), r.i32(), r.string(), r.i64(), log_offset)


def decode_group_value(raw: bytes) -> GroupRecord:
    r = RecordReader(raw)
    check_version(r)
    rec = GroupRecord(r.string(), r.i32(), r.string(), r.string(), r.i64())
    count = r.i32()
    if count < 0:
        raise OffsetsLogError("negative member count")
    for _ in range(count):
        member_id, instance = r.string(), r.string()
        client_id, host = r.string(), r.string()
        rec.members.append(MemberRecord(member_id or "", instance, client_id or "", host or "",
                                        r.i32(), r.i32(), r.bytes_(), r.bytes_()))
    return rec


# --- a group's offsets in memory ----------------------------------------------------------

class GroupOffsets:
    """Committed offsets plus transactional ones waiting for their marker.

    `pending` maps producer id -> partition -> value; those are invisible to
    OffsetFetch until the producer's COMMIT marker is in the log.
    """
    __slots__ = ("committed", "pending")

    def __init__(self) -> None:
        self.committed: dict[TopicPartition, CommittedOffset] = {}
        self.pending: dict[int, dict[TopicPartition, CommittedOffset]] = {}

    def put(self, tp: TopicPartition, value: CommittedOffset) -> None:
        cur = self.committed.get(tp)
        if cur is None or cur.log_offset < value.log_offset:
            self.committed[tp] = value

    def remove(self, tp: TopicPartition, tombstone_offset: int) -> None:
        """A tombstone drops the partition's committed offset and, as Kafka's
        removeOffsets does, any transactional one still pending from before it, so a
        later COMMIT marker cannot bring back an offset deleted meanwhile."""
        cur = self.committed.get(tp)
        if cur is not None and cur.log_offset < tombstone_offset:
            del self.committed[tp]
        for producer_id, values in list(self.pending.items()):
            value = values.get(tp)
            if value is not None and value.log_offset < tombstone_offset:
                del values[tp]
                if not values:
                    del self.pending[producer_id]

    def partitions(self) -> set[TopicPartition]:
        """Every partition with a committed or a pending offset."""
        out = set(self.committed)
        for values in self.pending.values():
            out.update(values)
        return out

    def add_pending(self, producer_id: int, tp: TopicPartition, value: CommittedOffset) -> None:
        self.pending.setdefault(producer_id, {})[tp] = value

    def complete(self, producer_id: int, commit: bool) -> None:
        """A marker for `producer_id`: its pending offsets become committed or vanish.
        A transactional value older in the log than a plain commit of the same
        partition loses to it, as it would in a replay."""
        values = self.pending.pop(producer_id, None)
        if commit and values:
            for tp, value in values.items():
                self.put(tp, value)

    def has_pending(self, tp: TopicPartition) -> bool:
        return any(tp in values for values in self.pending.values())

    def is_empty(self) -> bool:
        return not self.committed and not self.pending

    def expired(self, now_ms: int, retention_ms: int, since_ms: int | None) -> list[TopicPartition]:
        """Partitions whose offsets are older than the retention. `since_ms` is the
        time the group became empty (all offsets expire together then); None means
        a group without a protocol (manual assignment): each offset ages on its own."""
        if retention_ms < 0:
            return []
        if since_ms is not None:
            return list(self.committed) if now_ms - since_ms >= retention_ms else []
        return [tp for tp, v in self.committed.items() if now_ms - v.commit_ts >= retention_ms]


# --- reading the log ----------------------------------------------------------------------

def scan_log(plog: PartitionLog, chunk_bytes: int = 1 << 20
             ) -> Iterator[tuple[bytes | memoryview, int, BatchHeader]]:
    """(buffer, position, header) of every batch from log start to log end."""
    offset = plog.log_start_offset
    while offset < plog.log_end_offset:
        chunk = plog.read_checked(offset, chunk_bytes)   # damage on disk: CorruptLogError naming the file
        if not chunk:
            return
        advanced = False
        for pos, hdr in iter_batches(chunk):
            if hdr.next_offset <= offset:
                continue  # a batch before our position (read starts at a batch boundary)
            yield chunk, pos, hdr
            offset = hdr.next_offset
            advanced = True
        if not advanced:
            raise OffsetsLogError(f"no progress reading __consumer_offsets at offset {offset}")
