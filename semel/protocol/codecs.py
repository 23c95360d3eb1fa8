"""Bounded decompression of a RecordBatch v2 (sans-IO).

The broker stores batches as the client compressed them and never needs their
records, except where a topic feature reads keys (compacted topics: the null-key
check and the cleaner). There a 1 MiB batch of zeros can expand to gigabytes, so
the records are decompressed into at most `limit` bytes, never more: a batch
that would expand past it is refused (MESSAGE_TOO_LARGE) before the memory is
taken. The result is the same batch uncompressed (header patched), which
`records.iter_records` reads.

Codecs by attribute bits (Kafka): 1 gzip (zlib, bounded by max_length), 2 snappy
(raw or xerial-framed blocks: each raw block states its length up front),
3 lz4 frame and 4 zstd (cramjam's decompress_into a buffer that grows by doubling
up to the limit).
"""
from __future__ import annotations

import struct
import zlib
from typing import Any, Callable

from .errors import KafkaError
from .records import ATTR_COMPRESSION_MASK, HEADER_SIZE, Buffer, parse_header

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16      # magic (8) + version (4) + compatible version (4)


class DecodeError(Exception):
    """Why a batch's records cannot be had: carries the Kafka error to answer."""

    def __init__(self, error: KafkaError, why: str):
        super().__init__(why)
        self.error = error


def uncompressed_batch(raw: Buffer, limit: int) -> bytes:
    """The batch `raw` (one whole batch) with its records uncompressed."""
    hdr = parse_header(raw, 0)
    codec = hdr.attributes & ATTR_COMPRESSION_MASK
    if codec == 0:
        return bytes(raw)
    payload = bytes(memoryview(raw)[HEADER_SIZE:hdr.size])
    body = _DECODERS.get(codec, _unknown)(payload, limit)
    head = bytearray(raw[:HEADER_SIZE])
    struct.pack_into(">i", head, 8, HEADER_SIZE - 12 + len(body))     # batch length
    struct.pack_into(">h", head, 21, hdr.attributes & ~ATTR_COMPRESSION_MASK)
    return bytes(head) + body


def _too_large(limit: int) -> DecodeError:
    return DecodeError(KafkaError.MESSAGE_TOO_LARGE, f"records expand past {limit} bytes")


def _gzip(payload: bytes, limit: int) -> bytes:
    d = zlib.decompressobj(zlib.MAX_WBITS | 32)   # gzip or zlib header
    try:
        out = d.decompress(payload, limit + 1)
    except zlib.error as exc:
        raise DecodeError(KafkaError.CORRUPT_MESSAGE, f"gzip: {exc}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise _too_large(limit)
    return out


def _cramjam(name: str) -> Any:
    try:
        import cramjam
    except ImportError:   # the spark extra brings it; the base install reads gzip only
        raise DecodeError(KafkaError.UNSUPPORTED_COMPRESSION_TYPE, f"{name} needs cramjam") from None
    return getattr(cramjam, name)


def _into_growing_buffer(decompress_into: Callable[[bytes, bytearray], int], payload: bytes, limit: int,
                         name: str) -> bytes:
    size = min(limit, max(64 * 1024, 8 * len(payload)))
    while True:
        buf = bytearray(size)
        try:
            n = decompress_into(payload, buf)
        except Exception as exc:   # cramjam says "failed to write whole buffer" when it did not fit
            if "whole buffer" not in str(exc):
                raise DecodeError(KafkaError.CORRUPT_MESSAGE, f"{name}: {exc}") from None
            if size >= limit:
                raise _too_large(limit) from None
            size = min(limit, size * 2)
            continue
        return bytes(memoryview(buf)[:n])


def _lz4(payload: bytes, limit: int) -> bytes:
    return _into_growing_buffer(_cramjam("lz4").decompress_into, payload, limit, "lz4")


def _zstd(payload: bytes, limit: int) -> bytes:
    return _into_growing_buffer(_cramjam("zstd").decompress_into, payload, limit, "zstd")


def _snappy(payload: bytes, limit: int) -> bytes:
    snappy = _cramjam("snappy")
    blocks = _xerial_blocks(payload) if payload.startswith(_XERIAL_MAGIC) else [payload]
    out = bytearray()
    for block in blocks:
        stated = _snappy_length(block)
        if len(out) + stated > limit:
            raise _too_large(limit)
        buf = bytearray(stated)
        try:
            n = snappy.decompress_raw_into(block, buf)
        except Exception as exc:
            raise DecodeError(KafkaError.CORRUPT_MESSAGE, f"snappy: {exc}") from None
        out += memoryview(buf)[:n]
    return bytes(out)


def _snappy_length(block: bytes) -> int:
    """The uncompressed length a raw snappy block states up front (unsigned varint)."""
    shift = result = 0
    for b in block[:5]:
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result
        shift += 7
    raise DecodeError(KafkaError.CORRUPT_MESSAGE, "snappy: bad block length")


def _xerial_blocks(payload: bytes) -> list[bytes]:
    blocks, pos = [], _XERIAL_HEADER
    while pos < len(payload):
        if pos + 4 > len(payload):
            raise DecodeError(KafkaError.CORRUPT_MESSAGE, "snappy: truncated xerial block")
        (n,) = struct.unpack_from(">i", payload, pos)
        if n < 0 or pos + 4 + n > len(payload):
            raise DecodeError(KafkaError.CORRUPT_MESSAGE, "snappy: xerial block past the batch")
        blocks.append(payload[pos + 4:pos + 4 + n])
        pos += 4 + n
    return blocks


def _unknown(payload: bytes, limit: int) -> bytes:
    raise DecodeError(KafkaError.UNSUPPORTED_COMPRESSION_TYPE, "unknown compression codec")


_DECODERS = {1: _gzip, 2: _snappy, 3: _lz4, 4: _zstd}
