"""Small files that carry their own CRC-32C, read and written through the storage
FileSystem seam (semel.storage.fs), so an injected disk fault reaches them too.

Two layouts, both exactly as brokers have always written them:
  text    a first line "<header><crc32c hex>" (the header names the kind and version,
          e.g. "semel-epochs 1 "), then the body: the leader-epoch cache, the
          high-watermark checkpoint, the topic catalogue
  binary  the body, then its CRC-32C as a big-endian u32: the recovery checkpoint,
          the producer-state snapshots, the producer-id reservation
A reader gets the body back only when the checksum holds (and, for text, the header
matches), so a torn or foreign file never reads as wrong numbers: `decode`/`unseal`
answer None, `read` raises a DamagedFile that names the file and what is wrong.
`write` replaces a file atomically: a crash or failed write leaves the old content.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Callable

import crc32c

from .errors import StorageError
from .fs import FileSystem

_CRC = struct.Struct(">I")


class DamagedFile(StorageError):
    """A checked file whose checksum does not hold: torn, damaged or of another kind."""


def encode(header: str, body: bytes) -> bytes:
    return f"{header}{crc32c.crc32c(body):08x}\n".encode() + body


def decode(header: str, data: bytes) -> bytes | None:
    head, sep, body = data.partition(b"\n")
    text = head.decode("ascii", "replace")
    if not sep or not text.startswith(header) or text[len(header):] != f"{crc32c.crc32c(body):08x}":
        return None
    return body


def seal(body: bytes) -> bytes:
    """The binary layout: body, then its CRC-32C."""
    return bytes(body) + _CRC.pack(crc32c.crc32c(body))


def unseal(data: bytes, size: int | None = None) -> memoryview | None:
    """The body of a sealed record, or None when it is torn or damaged (or not `size` bytes)."""
    if len(data) < _CRC.size or (size is not None and len(data) != size):
        return None
    body = memoryview(data)[:-_CRC.size]
    if _CRC.unpack_from(data, len(data) - _CRC.size)[0] != crc32c.crc32c(body):
        return None
    return body


def write(fs: FileSystem, path: str | Path, data: bytes, *, sync_dir: bool = True) -> None:
    """Replace path with an encoded or sealed file (tmp, fsync, rename; OSError on failure)."""
    fs.write_atomic(path, data, sync_dir=sync_dir)


def read(fs: FileSystem, path: str | Path, opener: Callable[[bytes], bytes | memoryview | None],
         what: str) -> bytes | memoryview | None:
    """The body of the checked file at path through `opener` (a decode or unseal), None
    when there is no file; DamagedFile when its checksum does not hold."""
    try:
        data = fs.read_file(path)
    except FileNotFoundError:
        return None
    body = opener(data)
    if body is None:
        raise DamagedFile(f"{path}: torn or damaged {what} ({len(data)} bytes; checksum mismatch)")
    return body
