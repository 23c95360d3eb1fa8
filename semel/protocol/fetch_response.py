"""Fetch responses (v4-v12) framed around the stored record bytes, without copying them.

The generic codec copies a partition's records into its output buffer, and the
framing joins that into one more bytes object: three copies of every byte a
consumer reads, the largest CPU cost of a Fetch after the socket write itself.
Here the fixed fields around the records are packed with `struct`, and each
partition's records stay the buffer (or view) storage read them into. The
answer is a list of pieces the transport writes one after another (uvloop
sends them with one writev and keeps no copy).

Only what this broker sends is handled: a tagged field other than the defaults
(diverging epoch, current leader, snapshot id) or a version outside 4-12 makes
`encode_fetch` return None and the caller uses the generic codec. A test checks
byte equality with the generic codec.
"""
from __future__ import annotations

import struct
from typing import Any

MIN_VERSION, MAX_VERSION = 4, 12
FLEXIBLE_FROM = 12
# Records shorter than this are copied into the surrounding piece: one more
# small piece costs more than copying a few KiB.
INLINE_RECORDS_BYTES = 16 * 1024
_TAGGED = ("diverging_epoch", "current_leader", "snapshot_id")

_I16 = struct.Struct(">h")
I32 = struct.Struct(">i")
_TOP_V7 = struct.Struct(">ihi")          # throttle_time_ms, error_code, session_id
_PART = struct.Struct(">ihqqq")          # index, error, high watermark, LSO, log start
_PART_V4 = struct.Struct(">ihqq")        # v4 has no log start offset
_ABORTED = struct.Struct(">qq")          # producer id, first offset


def write_uvarint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def write_length(out: bytearray, n: int | None, flexible: bool) -> None:
    """An array or bytes length; None is null (-1, or 0 in the compact form)."""
    if flexible:
        write_uvarint(out, 0 if n is None else n + 1)
    else:
        out += I32.pack(-1 if n is None else n)


def encode_fetch(api_version: int, correlation_id: int, body: Any) -> list[Any] | None:
    """The framed response as pieces (bytes-like), or None when it needs the generic codec."""
    if not MIN_VERSION <= api_version <= MAX_VERSION:
        return None
    flexible = api_version >= FLEXIBLE_FROM
    head = out = bytearray(I32.pack(0) + I32.pack(correlation_id))   # frame size patched last
    if flexible:
        out.append(0)                              # response header v1: no tagged fields
    if api_version >= 7:
        out += _TOP_V7.pack(body.throttle_time_ms, body.error_code, body.session_id)
    else:
        out += I32.pack(body.throttle_time_ms)
    pieces: list[Any] = []
    topics = body.responses or ()
    write_length(out, len(topics), flexible)
    for t in topics:
        write_string(out, t.topic, flexible)
        parts = t.partitions or ()
        write_length(out, len(parts), flexible)
        for p in parts:
            if flexible and any(getattr(p, name, None) is not None for name in _TAGGED):
                return None
            out = _partition(out, p, api_version, flexible, pieces)
        if flexible:
            out.append(0)                          # topic tagged fields
    if flexible:
        out.append(0)                              # response tagged fields
    if out:
        pieces.append(out)
    I32.pack_into(head, 0, sum(len(x) for x in pieces) - 4)
    return pieces


def write_string(out: bytearray, s: str, flexible: bool) -> None:
    raw = s.encode()
    if flexible:
        write_uvarint(out, len(raw) + 1)
    else:
        out += _I16.pack(len(raw))
    out += raw


def _partition(out: bytearray, p: Any, version: int, flexible: bool, pieces: list[Any]) -> bytearray:
    """Append one partition's fields; a large records buffer becomes its own piece.
    Returns the buffer to continue in."""
    if version >= 5:
        out += _PART.pack(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                          p.log_start_offset)
    else:
        out += _PART_V4.pack(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset)
    aborted = p.aborted_transactions
    write_length(out, None if aborted is None else len(aborted), flexible)
    for a in aborted or ():
        out += _ABORTED.pack(a.producer_id, a.first_offset)
        if flexible:
            out.append(0)
    if version >= 11:
        out += I32.pack(p.preferred_read_replica)
    records = p.records
    write_length(out, None if records is None else len(records), flexible)
    if records is not None and len(records) >= INLINE_RECORDS_BYTES:
        pieces.append(out)
        pieces.append(records)
        out = bytearray()
    elif records:
        out += records
    if flexible:
        out.append(0)                              # partition tagged fields
    return out
