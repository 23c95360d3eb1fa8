"""The power-cut file system's page cache (semel.launch.lazyfs): the content of each
file as the mount shows it, and which byte ranges of it are not durable yet.

A file's pending content lives in a scratch directory, one file per modified node,
copied from the durable file on its first change; fsync copies the ranges written
since the last one (and any shrinking) to the durable file in the backing dir.
"""
from __future__ import annotations

import errno
import os
import random
import stat as stat_mod
import time
from typing import Iterable


class Node:
    __slots__ = ("ino", "is_dir", "mode", "uid", "gid", "atime", "mtime", "ctime", "children",
                 "parent", "name", "dpath", "size", "cache_fd", "backing_fd", "dirty", "trunc_low",
                 "opens", "linked")

    def __init__(self, ino: int, is_dir: bool, mode: int, uid: int, gid: int, now: int):
        self.ino = ino
        self.is_dir = is_dir
        self.mode = mode
        self.uid = uid
        self.gid = gid
        self.atime = self.mtime = self.ctime = now
        self.children: dict[str, Node] | None = {} if is_dir else None
        self.parent: Node | None = None   # volatile parent (None: root, or unlinked)
        self.name = ""                     # volatile name in parent
        self.dpath: str | None = None      # durable path relative to the backing dir
        self.size = 0
        self.cache_fd: int | None = None   # pending content; None: content is the backing file's
        self.backing_fd: int | None = None  # the durable inode, followed across renames
        self.dirty: list[list[int]] = []   # [start, end) ranges written since the last fsync
        self.trunc_low: int | None = None  # lowest size reached since the last fsync
        self.opens = 0
        self.linked = True



def oserror(code: int) -> OSError:
    return OSError(code, os.strerror(code))



class PageCache:
    """Pending file content under `cache_dir` over the durable files under `backing`.

    Paths of durable files are a node's `dpath`, relative to `backing`; a node without
    one (its name not durable yet) keeps all its content here until it gets one."""

    def __init__(self, backing: str, cache_dir: str):
        self.backing = backing
        self.cache_dir = cache_dir

    def backing_fd(self, node: Node) -> int | None:
        if node.backing_fd is None and node.dpath is not None:
            node.backing_fd = os.open(os.path.join(self.backing, node.dpath), os.O_RDWR | os.O_CLOEXEC)
        return node.backing_fd

    def ensure(self, node: Node) -> int:
        """Copy the durable content into the scratch directory before the first change."""
        if node.cache_fd is None:
            fd = os.open(os.path.join(self.cache_dir, str(node.ino)),
                         os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            src = self.backing_fd(node)
            if src is not None and node.size:
                copied = 0
                while copied < node.size:
                    n = os.copy_file_range(src, fd, node.size - copied, copied, copied)
                    if n == 0:
                        break
                    copied += n
            os.ftruncate(fd, node.size)
            node.cache_fd = fd
        return node.cache_fd

    def read(self, node: Node, size: int, offset: int) -> bytes:
        if offset >= node.size:
            return b""
        size = min(size, node.size - offset)
        fd = node.cache_fd if node.cache_fd is not None else self.backing_fd(node)
        if fd is None:
            return b"\0" * size
        data = os.pread(fd, size, offset)
        return data + b"\0" * (size - len(data))

    def write(self, node: Node, data: bytes, offset: int) -> int:
        fd = self.ensure(node)
        written = 0
        while written < len(data):
            written += os.pwrite(fd, data[written:], offset + written)
        end = offset + len(data)
        node.size = max(node.size, end)
        if node.dirty and node.dirty[-1][1] >= offset and node.dirty[-1][0] <= offset:
            node.dirty[-1][1] = max(node.dirty[-1][1], end)
        elif data:
            node.dirty.append([offset, end])
        node.mtime = node.ctime = time.time_ns()
        return len(data)

    def truncate(self, node: Node, length: int) -> None:
        if node.is_dir:
            raise oserror(errno.EISDIR)
        fd = self.ensure(node)
        os.ftruncate(fd, length)
        low = min(node.size, length)
        node.trunc_low = low if node.trunc_low is None else min(node.trunc_low, low)
        node.size = length
        node.dirty = [[s, min(e, length)] for s, e in node.dirty if s < length]
        node.mtime = node.ctime = time.time_ns()

    def flush(self, node: Node) -> None:
        """Make a file's pending content durable at its durable path (if it has one)."""
        if node.dpath is not None and (node.dirty or node.trunc_low is not None):
            dst = self.backing_fd(node)
            src = node.cache_fd
            if node.trunc_low is not None:
                os.ftruncate(dst, node.trunc_low)
                os.ftruncate(dst, node.size)
            for start, end in sorted(node.dirty):
                pos = start
                while pos < end:
                    n = os.copy_file_range(src, dst, end - pos, pos, pos)
                    if n == 0:
                        break
                    pos += n
            if os.fstat(dst).st_size != node.size:
                os.ftruncate(dst, node.size)
            os.fchmod(dst, stat_mod.S_IMODE(node.mode))
        node.dirty = []
        node.trunc_low = None

    def drop(self, node: Node) -> None:
        """Forget the pending content of a node nothing can reach any more."""
        for attr in ("cache_fd", "backing_fd"):
            fd = getattr(node, attr)
            if fd is not None:
                os.close(fd)
                setattr(node, attr, None)
        try:
            os.unlink(os.path.join(self.cache_dir, str(node.ino)))
        except FileNotFoundError:
            pass

    def adopt(self, node: Node, fd: int) -> None:
        """The file's name became durable as `fd`, a new empty file: everything written
        to it so far is pending data."""
        if node.backing_fd is not None:
            os.close(node.backing_fd)
        node.backing_fd = fd
        node.trunc_low = 0
        node.dirty = [[0, node.size]] if node.size else []

    def tear(self, nodes: Iterable[Node], rng: random.Random) -> None:
        """What a disk may have written of the pending data when the power went: for
        every file of `nodes` with a durable name, a random prefix (often none, sometimes all) of
        each range written since its last fsync. Namespace changes stay lost."""
        for node in list(nodes):
            if node.is_dir or node.cache_fd is None or not node.dirty:
                continue
            dst = self.backing_fd(node)
            for start, end in node.dirty:
                keep = rng.choice((0, rng.randrange(0, end - start + 1), end - start))
                pos = start
                while pos < start + keep:
                    n = os.copy_file_range(node.cache_fd, dst, start + keep - pos, pos, pos)
                    if n == 0:
                        break
                    pos += n
