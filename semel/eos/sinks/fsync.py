"""Durability of a rename: the directory entry reaches the disk only when the
directory itself is fsynced, so the file sinks and the reference HTTP server
fsync the directories a rename touched before they answer."""
from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
