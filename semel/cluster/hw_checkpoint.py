"""Every partition's high watermark, saved now and then in the data directory (Kafka's
replication-offset-checkpoint), so a restarted broker does not start from zero.

The numbers are only a head start: a damaged or missing file reads as empty, and the
leader moves each high watermark on from its followers' fetches anyway.
"""
from __future__ import annotations

from pathlib import Path

from ..storage import checked_file
from ..storage.fs import FileSystem
from .replica_rules import TopicPartition

HW_FILE = "replication-offset.checkpoint"
_HW_HEADER = "semel-hw 1 "
HW_SAVE_INTERVAL_S = 5.0


def encode_hws(hws: dict[TopicPartition, int]) -> bytes:
    return checked_file.encode(_HW_HEADER, "".join(f"{t} {p} {hw}\n" for (t, p), hw in sorted(hws.items())).encode())


def decode_hws(data: bytes) -> dict[TopicPartition, int]:
    """The saved high watermarks; {} when the file is damaged."""
    body = checked_file.decode(_HW_HEADER, data)
    out: dict[TopicPartition, int] = {}
    try:
        for line in (body or b"").decode("ascii").splitlines():
            t, p, hw = line.split()
            out[(t, int(p))] = int(hw)
    except ValueError:
        return {}
    return out


def load_hws(fs: FileSystem, path: Path) -> dict[TopicPartition, int]:
    try:
        return decode_hws(fs.read_file(path))
    except FileNotFoundError:
        return {}


def save_hws(fs: FileSystem, path: Path, hws: dict[TopicPartition, int]) -> None:
    """Atomically (temp file, fsync, rename); OSError when it cannot."""
    checked_file.write(fs, path, encode_hws(hws))
