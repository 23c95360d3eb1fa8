"""The consumer's embedded protocol of the classic group APIs: the subscription a
member puts in JoinGroup's protocol metadata and the assignment SyncGroup carries.

Subscription (int16 version first): array of string topics, nullable bytes user data,
v1+ owned partitions (array of string topic, array of int32), v2+ int32 generation,
v3+ nullable string rack. Assignment: int16 version, array of (string topic, array of
int32 partition), nullable bytes user data. Big-endian, int32 array lengths, int16
string lengths, as the classic consumer writes them. Sans-IO: bytes in, values out.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterable

PROTOCOL_TYPE = "consumer"
_I16, _I32 = struct.Struct(">h"), struct.Struct(">i")


class MalformedProtocol(ValueError):
    """Metadata or an assignment that is not the consumer's embedded protocol."""


@dataclass(frozen=True)
class Subscription:
    topics: tuple[str, ...]
    owned: frozenset[tuple[str, int]] = frozenset()
    rack: str | None = None


class _Reader:
    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = bytes(buf), 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise MalformedProtocol("shorter than its fields")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def i16(self) -> int:
        return int(_I16.unpack(self.take(2))[0])

    def i32(self) -> int:
        return int(_I32.unpack(self.take(4))[0])

    def string(self) -> str | None:
        n = self.i16()
        return None if n < 0 else self.take(n).decode("utf-8", "replace")

    def count(self) -> int:
        n = self.i32()
        return max(n, 0)   # a null array reads as empty

    def left(self) -> int:
        return len(self.buf) - self.pos


def _partitions(r: _Reader) -> frozenset[tuple[str, int]]:
    out: set[tuple[str, int]] = set()
    for _ in range(r.count()):
        topic = r.string() or ""
        out.update((topic, r.i32()) for _ in range(r.count()))
    return frozenset(out)


def decode_subscription(metadata: bytes) -> Subscription:
    """A member's subscription; MalformedProtocol when the bytes are not one."""
    r = _Reader(metadata)
    version = r.i16()
    if version < 0:
        raise MalformedProtocol(f"subscription version {version}")
    topics = tuple(r.string() or "" for _ in range(r.count()))
    n = r.i32()
    if n > 0:
        r.take(n)   # user data, the client assignor's own
    owned: frozenset[tuple[str, int]] = frozenset()
    rack = None
    if version >= 1 and r.left():
        owned = _partitions(r)
    if version >= 2 and r.left():
        r.i32()   # generation
    if version >= 3 and r.left():
        rack = r.string()
    return Subscription(topics, owned, rack)


def encode_assignment(partitions: Iterable[tuple[str, int]], version: int = 0) -> bytes:
    """The assignment SyncGroup hands a member, with no user data."""
    by_topic: dict[str, list[int]] = {}
    for topic, p in partitions:
        by_topic.setdefault(topic, []).append(p)
    out = bytearray(_I16.pack(version) + _I32.pack(len(by_topic)))
    for topic in sorted(by_topic):
        raw = topic.encode("utf-8")
        out += _I16.pack(len(raw)) + raw + _I32.pack(len(by_topic[topic]))
        for p in sorted(by_topic[topic]):
            out += _I32.pack(p)
    out += _I32.pack(-1)   # null user data
    return bytes(out)


def decode_assignment(raw: bytes) -> frozenset[tuple[str, int]]:
    """The partitions of an assignment (empty bytes: none)."""
    if not raw:
        return frozenset()
    r = _Reader(raw)
    if r.i16() < 0:
        raise MalformedProtocol("negative assignment version")
    return _partitions(r)
