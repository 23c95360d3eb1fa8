"""Small text files that carry their own checksum: a first line "<header><crc32c hex>"
(the header names the kind and version, e.g. "semel-epochs 1 "), then the body.
A reader gets the body back only when the header matches and the checksum holds, so
a torn or foreign file reads as absent, never as wrong numbers."""
from __future__ import annotations

import crc32c


def encode(header: str, body: bytes) -> bytes:
    return f"{header}{crc32c.crc32c(body):08x}\n".encode() + body


def decode(header: str, data: bytes) -> bytes | None:
    head, sep, body = data.partition(b"\n")
    text = head.decode("ascii", "replace")
    if not sep or not text.startswith(header) or text[len(header):] != f"{crc32c.crc32c(body):08x}":
        return None
    return body
