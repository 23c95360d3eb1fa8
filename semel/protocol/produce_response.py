"""Produce responses (v3-v9) built and framed without the generic codec.

Every Produce is answered, one entry per partition it named, and kafka-python's
message objects cost tens of microseconds per partition to build (each field is
checked on the way in) and as much again to encode: with 100 B records over eight
partitions that is most of the broker's CPU per produced byte. The produce handler
answers with the plain slotted objects below, which have the attribute names of
kafka-python's ProduceResponse, and `encode_produce` packs them with `struct`.
It reads attributes only, so entries of kafka-python's own classes (the ACL gate
adds those for denied topics) are encoded the same way. A test checks byte
equality with the generic codec.
"""
from __future__ import annotations

import struct
from typing import Any

from .fetch_response import I32, write_length, write_string, write_uvarint

MIN_VERSION, MAX_VERSION = 3, 9
FLEXIBLE_FROM = 9

_I16 = struct.Struct(">h")
_PART_V2 = struct.Struct(">ihqq")       # index, error code, base offset, log append time
_PART_V5 = struct.Struct(">ihqqq")      # ... and log start offset


class ProducePartitionAnswer:
    __slots__ = ("index", "error_code", "base_offset", "log_append_time_ms", "log_start_offset",
                 "record_errors", "error_message")

    def __init__(self, index: int, error_code: int, base_offset: int, log_start_offset: int,
                 error_message: str | None = None, log_append_time_ms: int = -1):
        self.index, self.error_code, self.base_offset = index, int(error_code), base_offset
        self.log_append_time_ms, self.log_start_offset = log_append_time_ms, log_start_offset
        self.record_errors: list[RecordError] = []
        self.error_message = error_message


class RecordError:
    """KIP-467: one record that made its batch fail (index in the batch, why)."""
    __slots__ = ("batch_index", "batch_index_error_message")

    def __init__(self, batch_index: int, message: str | None):
        self.batch_index, self.batch_index_error_message = batch_index, message


class ProduceTopicAnswer:
    __slots__ = ("name", "partition_responses")

    def __init__(self, name: str, partition_responses: list[ProducePartitionAnswer]):
        self.name, self.partition_responses = name, partition_responses


class ProduceAnswer:
    """The body of a Produce response; `responses` may be extended (ACL gate)."""
    __slots__ = ("version", "responses", "throttle_time_ms")

    def __init__(self, version: int, responses: list[ProduceTopicAnswer], throttle_time_ms: int = 0):
        self.version, self.responses, self.throttle_time_ms = version, responses, throttle_time_ms


def encode_produce(api_version: int, correlation_id: int, body: Any) -> bytes | None:
    """The framed response, or None when it needs the generic codec (a version outside 3-9)."""
    if not MIN_VERSION <= api_version <= MAX_VERSION:
        return None
    flexible = api_version >= FLEXIBLE_FROM
    out = bytearray(I32.pack(0) + I32.pack(correlation_id))   # frame size patched last
    if flexible:
        out.append(0)                              # response header v1: no tagged fields
    part = _PART_V5 if api_version >= 5 else _PART_V2
    topics = body.responses or ()
    write_length(out, len(topics), flexible)
    for t in topics:
        write_string(out, t.name, flexible)
        parts = t.partition_responses or ()
        write_length(out, len(parts), flexible)
        for p in parts:
            if api_version >= 5:
                out += part.pack(p.index, p.error_code, p.base_offset, p.log_append_time_ms, p.log_start_offset)
            else:
                out += part.pack(p.index, p.error_code, p.base_offset, p.log_append_time_ms)
            if api_version >= 8:
                errors = p.record_errors or ()
                write_length(out, len(errors), flexible)
                for e in errors:
                    out += I32.pack(e.batch_index)
                    _nullable_string(out, e.batch_index_error_message, flexible)
                    if flexible:
                        out.append(0)              # record error tagged fields
                _nullable_string(out, p.error_message, flexible)
            if flexible:
                out.append(0)                      # partition tagged fields
        if flexible:
            out.append(0)                          # topic tagged fields
    out += I32.pack(body.throttle_time_ms)
    if flexible:
        out.append(0)                              # response tagged fields
    I32.pack_into(out, 0, len(out) - 4)
    return bytes(out)


def _nullable_string(out: bytearray, s: str | None, flexible: bool) -> None:
    if s is not None:
        write_string(out, s, flexible)
    elif flexible:
        write_uvarint(out, 0)
    else:
        out += _I16.pack(-1)
