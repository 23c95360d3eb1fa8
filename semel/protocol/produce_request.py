"""Produce request bodies decoded without copying their records.

kafka-python's generated decoder copies every `records` field into a new bytes
object; for a produce request that is the whole payload once more per request.
Here the records of each partition come back as a memoryview of the frame, so
storage can patch offsets in place and write the client's bytes as they came
(a writable frame — FrameDecoder hands out bytearrays — gives writable views).

The result is kafka-python's own ProduceRequest object, so handlers, the ACL
gate and partition_count see the same shape as for any other request. Versions
3..12 share one layout (9+ flexible: compact strings and arrays, tagged fields);
13 names topics by id and is left to the generic decoder.
"""
from __future__ import annotations

import struct

from kafka.protocol.producer import ProduceRequest

from .errors import ProtocolError

FAST_VERSIONS = range(3, 13)
FIRST_FLEXIBLE = 9

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")
_Topic = ProduceRequest.TopicProduceData
_Partition = _Topic.PartitionProduceData


class DecodeInThread(Exception):
    """The frame is not one to decode on the event loop (decode_request's loop_partitions)."""


class Cursor:
    """A position in a request frame: each read checks it stays inside the frame
    (the request header is read with one too, see messages.decode_request)."""
    __slots__ = ("view", "pos", "end", "flexible")

    def __init__(self, view: memoryview, pos: int, flexible: bool):
        self.view, self.pos, self.end, self.flexible = view, pos, len(view), flexible

    def take(self, n: int) -> int:
        """Advance by n bytes; returns where they start."""
        at = self.pos
        if n < 0 or at + n > self.end:
            raise ProtocolError("produce request truncated")
        self.pos = at + n
        return at

    def int16(self) -> int:
        value: int = _I16.unpack_from(self.view, self.take(2))[0]
        return value

    def int32(self) -> int:
        value: int = _I32.unpack_from(self.view, self.take(4))[0]
        return value

    def uvarint(self) -> int:
        out = shift = 0
        while True:
            b = self.view[self.take(1)]
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 28:
                raise ProtocolError("varint longer than 5 bytes")

    def length(self) -> int:
        """A string/bytes/array length; -1 means null."""
        return self.uvarint() - 1 if self.flexible else self.int32()

    def string(self, nullable: bool) -> str | None:
        n = self.uvarint() - 1 if self.flexible else self.int16()
        if n < 0:
            if nullable:
                return None
            raise ProtocolError("null string where the schema allows none")
        at = self.take(n)
        try:
            return str(self.view[at:at + n], "utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"string is not UTF-8: {exc.reason}") from None

    def array_length(self) -> int:
        n = self.length()
        if n < 0:
            raise ProtocolError("null array where the schema allows none")
        return n

    def skip_tags(self) -> None:
        if self.flexible:
            for _ in range(self.uvarint()):
                self.uvarint()                  # tag
                self.take(self.uvarint())       # its bytes


def decode_produce(view: memoryview, pos: int, version: int, max_partitions: int | None = None) -> ProduceRequest:
    """The ProduceRequest body starting at `pos` of the frame `view`; each
    partition's `records` is a view into `view` (None when sent as null).
    Raises ProtocolError on anything malformed (bytes after the body are
    ignored, as the generic decoder does), DecodeInThread as soon as the topics
    read so far name more than max_partitions (each array's length is read before
    its entries are, so no more than that many are decoded before giving up)."""
    r = Cursor(view, pos, version >= FIRST_FLEXIBLE)
    named = 0
    transactional_id = r.string(nullable=True)
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(view, r.take(_ACKS_TIMEOUT.size))
    topics = []
    for _ in range(r.array_length()):
        name = r.string(nullable=False)
        parts = []
        count = r.array_length()
        named += count
        if max_partitions is not None and named > max_partitions:
            raise DecodeInThread()
        for _ in range(count):
            index = r.int32()
            n = r.length()
            records = None if n < 0 else view[r.take(n):r.pos]
            r.skip_tags()
            parts.append(_Partition(version=version, index=index, records=records))
        r.skip_tags()
        topics.append(_Topic(version=version, name=name, partition_data=parts))
    r.skip_tags()
    return ProduceRequest(version=version, transactional_id=transactional_id, acks=acks, timeout_ms=timeout_ms,
                          topic_data=topics)
