"""A power-cut file system for tests: a FUSE passthrough that keeps everything
not fsynced in memory, so killing it loses exactly what a power cut loses.

SIGKILL of a broker keeps the kernel's page cache: a byte written but never
fsynced survives it. A power cut does not keep it. This layer makes the
difference testable: processes work on MOUNT_DIR, and BACKING_DIR holds only
what was made durable.

Run it as ``python -m semel.launch.lazyfs BACKING_DIR MOUNT_DIR`` in its own
process, or through `PowerCutDisk`. What reaches BACKING_DIR, and when:

- file data and size (write, truncate, O_TRUNC, ftruncate): on fsync or
  fdatasync of that file, and only if the file has a durable name then;
- a namespace change (create, mkdir, unlink, rmdir, rename): on fsync of its
  parent directory; a rename across directories on fsync of either one, as
  ext4 journals it as one transaction;
- like ext4, fsync of a file (or directory) whose own directory entry is not
  durable yet also makes that entry durable (its create and the renames of it
  since), so "create, write, fsync the file" leaves the file with its data;
  fsync of a file does NOT make a later rename of an already durable file
  durable: that needs the directory's fsync;
- a namespace change that depends on an earlier pending one (mkdir d before a
  create in d, create x before rename x) takes that earlier change along; two
  changes on unrelated paths reach the disk independently.

Until then reads, stat and readdir see the pending state, so processes on the
mount see their own writes, and a file opened before it was renamed or
unlinked keeps working through its descriptor.

A power cut is SIGKILL of this daemon (all pending state is simply gone), a
lazy unmount, and a fresh daemon on the same BACKING_DIR: `PowerCutDisk.cut()`.
A torn cut (`cut(torn=True)`, SIGUSR2 to the daemon) first writes a random
prefix of each pending write range of every durably named file, as a disk may
leave a half-written tail; pending namespace changes are lost all the same.

Pending file data lives in a scratch directory (the "page cache", one file per
modified file, copied on first write), pending namespace changes in an
in-memory log. Hard links and symlinks are not supported (ENOTSUP): semel's
storage uses neither. The kernel's page cache stays on (no direct_io), so
read-only mmap of a file on the mount works; attribute and entry caching are
off so every process sees the daemon's state at once.
"""
from __future__ import annotations

import argparse
import errno
import logging
import os
import random
import shutil
import signal
import stat as stat_mod
import subprocess
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger("semel.lazyfs")

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


# --------------------------------------------------------------------------------------
# The daemon's state: a volatile tree of nodes, each knowing where it lives durably.
# --------------------------------------------------------------------------------------

class _Node:
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
        self.children: dict[str, _Node] | None = {} if is_dir else None
        self.parent: _Node | None = None   # volatile parent (None: root, or unlinked)
        self.name = ""                     # volatile name in parent
        self.dpath: str | None = None      # durable path relative to the backing dir
        self.size = 0
        self.cache_fd: int | None = None   # pending content; None: content is the backing file's
        self.backing_fd: int | None = None  # the durable inode, followed across renames
        self.dirty: list[list[int]] = []   # [start, end) ranges written since the last fsync
        self.trunc_low: int | None = None  # lowest size reached since the last fsync
        self.opens = 0
        self.linked = True


class _Op:
    """One pending namespace change, with the volatile paths it had when it was made."""
    __slots__ = ("kind", "paths", "dirs", "node", "replaced", "mode", "hide")

    def __init__(self, kind: str, paths: tuple[str, ...], dirs: tuple[_Node, ...], node: _Node,
                 replaced: _Node | None = None, mode: int = 0o644):
        self.kind = kind
        self.paths = paths
        self.dirs = dirs
        self.node = node
        self.replaced = replaced
        self.mode = mode
        self.hide = False

    def conflicts(self, other: "_Op") -> bool:
        for a in self.paths:
            for b in other.paths:
                if a == b or a.startswith(b + "/") or b.startswith(a + "/"):
                    return True
        return False


def _oserror(code: int) -> OSError:
    return OSError(code, os.strerror(code))


class LazyState:
    """Everything the daemon knows; the FUSE operations below are thin wrappers.

    Paths here are relative to the mount root without a leading slash ("" is the root)."""

    def __init__(self, backing: str, cache_dir: str):
        self.backing = os.path.abspath(backing)
        self.cache_dir = cache_dir
        self.next_ino = 1
        self.ops: list[_Op] = []
        self.at_dpath: dict[str, _Node] = {}
        # libfuse keeps an open file it is asked to unlink (or rename over) reachable
        # by renaming it to .fuse_hiddenNNN; to us that is an unlink, and the hidden
        # name is only a way to find the node until its last handle closes.
        self.hidden: dict[str, _Node] = {}
        st = os.stat(self.backing)
        self.root = self._new(True, st.st_mode, st.st_uid, st.st_gid)
        self._from_stat(self.root, st)
        self.root.dpath = ""
        self.at_dpath[""] = self.root
        self._load(self.root, "")

    # -- building ----------------------------------------------------------------------
    def _new(self, is_dir: bool, mode: int, uid: int, gid: int) -> _Node:
        node = _Node(self.next_ino, is_dir, mode, uid, gid, time.time_ns())
        self.next_ino += 1
        return node

    @staticmethod
    def _from_stat(node: _Node, st: os.stat_result) -> None:
        node.atime, node.mtime, node.ctime = st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns
        node.size = 0 if node.is_dir else st.st_size

    def _load(self, directory: _Node, rel: str) -> None:
        with os.scandir(os.path.join(self.backing, rel)) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            if not (stat_mod.S_ISDIR(st.st_mode) or stat_mod.S_ISREG(st.st_mode)):
                continue
            node = self._new(stat_mod.S_ISDIR(st.st_mode), st.st_mode, st.st_uid, st.st_gid)
            self._from_stat(node, st)
            child_rel = f"{rel}/{entry.name}" if rel else entry.name
            node.dpath = child_rel
            self.at_dpath[child_rel] = node
            self._attach(directory, entry.name, node)
            if node.is_dir:
                self._load(node, child_rel)

    @staticmethod
    def _attach(directory: _Node, name: str, node: _Node) -> None:
        directory.children[name] = node
        node.parent = directory
        node.name = name

    # -- lookups -----------------------------------------------------------------------
    @staticmethod
    def rel(path: str) -> str:
        return path.strip("/")

    def lookup(self, rel: str) -> _Node:
        hidden = self.hidden.get(rel)
        if hidden is not None:
            return hidden
        node = self.root
        if rel:
            for part in rel.split("/"):
                if not node.is_dir:
                    raise _oserror(errno.ENOTDIR)
                node = node.children.get(part)
                if node is None:
                    raise _oserror(errno.ENOENT)
        return node

    def parent_of(self, rel: str) -> tuple[_Node, str]:
        head, _, name = rel.rpartition("/")
        if not name:
            raise _oserror(errno.EEXIST)
        parent = self.lookup(head)
        if not parent.is_dir:
            raise _oserror(errno.ENOTDIR)
        return parent, name

    # -- attributes --------------------------------------------------------------------
    def attrs(self, node: _Node) -> dict:
        return {
            "st_ino": node.ino,
            "st_mode": node.mode,
            "st_nlink": (2 + sum(1 for c in node.children.values() if c.is_dir)) if node.is_dir
            else (1 if node.linked else 0),
            "st_uid": node.uid,
            "st_gid": node.gid,
            "st_size": node.size if not node.is_dir else 4096,
            "st_blocks": (node.size + 511) // 512,
            "st_blksize": 4096,
            "st_atime": node.atime,
            "st_mtime": node.mtime,
            "st_ctime": node.ctime,
        }

    # -- file content --------------------------------------------------------------------
    def _backing_fd(self, node: _Node) -> int | None:
        if node.backing_fd is None and node.dpath is not None:
            node.backing_fd = os.open(os.path.join(self.backing, node.dpath), os.O_RDWR | os.O_CLOEXEC)
        return node.backing_fd

    def _ensure_cache(self, node: _Node) -> int:
        """Copy the durable content into the scratch directory before the first change."""
        if node.cache_fd is None:
            fd = os.open(os.path.join(self.cache_dir, str(node.ino)),
                         os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            src = self._backing_fd(node)
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

    def read(self, node: _Node, size: int, offset: int) -> bytes:
        if offset >= node.size:
            return b""
        size = min(size, node.size - offset)
        fd = node.cache_fd if node.cache_fd is not None else self._backing_fd(node)
        if fd is None:
            return b"\0" * size
        data = os.pread(fd, size, offset)
        return data + b"\0" * (size - len(data))

    def write(self, node: _Node, data: bytes, offset: int) -> int:
        fd = self._ensure_cache(node)
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

    def truncate(self, node: _Node, length: int) -> None:
        if node.is_dir:
            raise _oserror(errno.EISDIR)
        fd = self._ensure_cache(node)
        os.ftruncate(fd, length)
        low = min(node.size, length)
        node.trunc_low = low if node.trunc_low is None else min(node.trunc_low, low)
        node.size = length
        node.dirty = [[s, min(e, length)] for s, e in node.dirty if s < length]
        node.mtime = node.ctime = time.time_ns()

    def _flush_data(self, node: _Node) -> None:
        """Make a file's pending content durable at its durable path (if it has one)."""
        if node.dpath is not None and (node.dirty or node.trunc_low is not None):
            dst = self._backing_fd(node)
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

    def _drop(self, node: _Node) -> None:
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

    def _maybe_drop(self, node: _Node) -> None:
        if not node.linked and node.opens == 0 and not node.is_dir:
            self._drop(node)

    # -- namespace changes (pending) --------------------------------------------------------
    def create(self, rel: str, mode: int, uid: int, gid: int, is_dir: bool) -> _Node:
        parent, name = self.parent_of(rel)
        if name in parent.children:
            raise _oserror(errno.EEXIST)
        node = self._new(is_dir, mode, uid, gid)
        if not is_dir:
            self._ensure_cache(node)
        self._attach(parent, name, node)
        parent.mtime = parent.ctime = node.ctime
        self.ops.append(_Op("mkdir" if is_dir else "create", (rel,), (parent,), node,
                            mode=stat_mod.S_IMODE(mode)))
        return node

    def remove(self, rel: str, is_dir: bool) -> None:
        hidden = self.hidden.pop(rel, None)
        if hidden is not None:           # the last handle of an unlinked file closed
            self._maybe_drop(hidden)
            return
        parent, name = self.parent_of(rel)
        node = parent.children.get(name)
        if node is None:
            raise _oserror(errno.ENOENT)
        if is_dir and not node.is_dir:
            raise _oserror(errno.ENOTDIR)
        if not is_dir and node.is_dir:
            raise _oserror(errno.EISDIR)
        if is_dir and node.children:
            raise _oserror(errno.ENOTEMPTY)
        del parent.children[name]
        node.parent = None
        node.linked = False
        parent.mtime = parent.ctime = time.time_ns()
        self.ops.append(_Op("rmdir" if is_dir else "unlink", (rel,), (parent,), node))
        self._maybe_drop(node)

    def rename(self, old: str, new: str, flags: int) -> None:
        if flags & _RENAME_EXCHANGE:
            raise _oserror(errno.EINVAL)
        if new.rpartition("/")[2].startswith(".fuse_hidden"):
            node = self.lookup(old)
            self.remove(old, node.is_dir)
            self.ops[-1].hide = True
            self.hidden[new] = node
            return
        src_parent, src_name = self.parent_of(old)
        node = src_parent.children.get(src_name)
        if node is None:
            raise _oserror(errno.ENOENT)
        dst_parent, dst_name = self.parent_of(new)
        if node.is_dir:  # no directory into its own subtree
            walk = dst_parent
            while walk is not None:
                if walk is node:
                    raise _oserror(errno.EINVAL)
                walk = walk.parent
        target = dst_parent.children.get(dst_name)
        if target is node:
            return
        if target is not None:
            if flags & _RENAME_NOREPLACE:
                raise _oserror(errno.EEXIST)
            if target.is_dir and not node.is_dir:
                raise _oserror(errno.EISDIR)
            if node.is_dir and not target.is_dir:
                raise _oserror(errno.ENOTDIR)
            if target.is_dir and target.children:
                raise _oserror(errno.ENOTEMPTY)
            del dst_parent.children[dst_name]
            target.parent = None
            target.linked = False
        del src_parent.children[src_name]
        self._attach(dst_parent, dst_name, node)
        now = time.time_ns()
        src_parent.mtime = src_parent.ctime = dst_parent.mtime = dst_parent.ctime = node.ctime = now
        dirs = (src_parent,) if src_parent is dst_parent else (src_parent, dst_parent)
        last = self.ops[-1] if self.ops else None
        if target is None and last is not None and last.hide and last.paths == (new,):
            # libfuse hid an open target just before this rename: one rename-over, as
            # the application asked, not an unlink and a rename a cut could split.
            self.ops.pop()
            target = last.node
        self.ops.append(_Op("rename", (old, new), dirs, node, replaced=target))
        if target is not None:
            self._maybe_drop(target)

    # -- making things durable ------------------------------------------------------------
    def _commit(self, wanted) -> None:
        """Apply to the backing dir the pending ops for which wanted(op) holds, with every
        earlier op they depend on (one on an overlapping path), in log order."""
        chosen: list[_Op] = []
        for op in reversed(self.ops):
            if wanted(op) or any(op.conflicts(later) for later in chosen):
                chosen.append(op)
        if not chosen:
            return
        chosen_ids = {id(op) for op in chosen}
        self.ops = [op for op in self.ops if id(op) not in chosen_ids]
        for op in reversed(chosen):
            try:
                self._apply(op)
            except OSError as exc:
                # A bug of this layer, never of the program on the mount: say so loudly.
                log.error("lazyfs: cannot apply %s %s to %s: %s", op.kind, op.paths, self.backing, exc)
                raise
            if op.kind == "create" and not op.node.linked and op.node.opens == 0:
                self._drop(op.node)   # unlinked and closed: only its name is left to commit

    def _apply(self, op: _Op) -> None:
        b = self.backing
        if op.kind == "create":
            path = op.paths[0]
            fd = os.open(os.path.join(b, path), os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, op.mode)
            self._unmap(path)
            self._map(path, op.node)
            if op.node.backing_fd is not None:
                os.close(op.node.backing_fd)
            op.node.backing_fd = fd
            # The durable file starts empty: everything written so far is pending data.
            op.node.trunc_low = 0
            op.node.dirty = [[0, op.node.size]] if op.node.size else []
        elif op.kind == "mkdir":
            path = op.paths[0]
            os.mkdir(os.path.join(b, path), op.mode)
            self._map(path, op.node)
        elif op.kind in ("unlink", "rmdir"):
            path = op.paths[0]
            (os.rmdir if op.kind == "rmdir" else os.unlink)(os.path.join(b, path))
            self._unmap(path)
        else:
            src, dst = op.paths
            os.replace(os.path.join(b, src), os.path.join(b, dst))
            self._unmap(dst)
            moved = self.at_dpath.pop(src)
            self._map(dst, moved)
            prefix = src + "/"
            for key in [k for k in self.at_dpath if k.startswith(prefix)]:
                child = self.at_dpath.pop(key)
                self._map(dst + "/" + key[len(prefix):], child)

    def _map(self, path: str, node: _Node) -> None:
        self.at_dpath[path] = node
        node.dpath = path

    def _unmap(self, path: str) -> None:
        old = self.at_dpath.pop(path, None)
        if old is not None:
            old.dpath = None
            prefix = path + "/"
            for key in [k for k in self.at_dpath if k.startswith(prefix)]:
                self.at_dpath.pop(key).dpath = None

    def tear(self, rng: random.Random) -> None:
        """What a disk may have written of the pending data when the power went: for
        every file with a durable name, a random prefix (often none, sometimes all) of
        each range written since its last fsync. Namespace changes stay lost."""
        for node in list(self.at_dpath.values()):
            if node.is_dir or node.cache_fd is None or not node.dirty:
                continue
            dst = self._backing_fd(node)
            for start, end in node.dirty:
                keep = rng.choice((0, rng.randrange(0, end - start + 1), end - start))
                pos = start
                while pos < start + keep:
                    n = os.copy_file_range(node.cache_fd, dst, start + keep - pos, pos, pos)
                    if n == 0:
                        break
                    pos += n

    def _commit_entry(self, node: _Node) -> None:
        if node.dpath is None:
            self._commit(lambda op: op.node is node)

    def fsync_file(self, node: _Node) -> None:
        self._commit_entry(node)
        if not node.is_dir:
            self._flush_data(node)

    def fsync_dir(self, node: _Node) -> None:
        self._commit_entry(node)
        self._commit(lambda op: any(d is node for d in op.dirs))


# --------------------------------------------------------------------------------------
# FUSE glue
# --------------------------------------------------------------------------------------

def _operations_class():
    import mfusepy

    class LazyOps(mfusepy.Operations):
        use_ns = True
        flag_nopath = True       # ops on an open file get its handle, not a path
        flag_nullpath_ok = True

        def __init__(self, state: LazyState):
            self.state = state
            self.handles: dict[int, _Node] = {}
            self.next_fh = 1

        def _fh(self, node: _Node) -> int:
            fh = self.next_fh
            self.next_fh += 1
            self.handles[fh] = node
            node.opens += 1
            return fh

        def _node(self, path, fh) -> _Node:
            if fh:
                node = self.handles.get(fh)
                if node is not None:
                    return node
            if path is None:
                raise _oserror(errno.EBADF)
            return self.state.lookup(self.state.rel(path))

        def getattr(self, path, fh=None):
            return self.state.attrs(self._node(path, fh))

        def access(self, path, amode):
            self.state.lookup(self.state.rel(path))
            return 0

        def statfs(self, path):
            sv = os.statvfs(self.state.backing)
            return {key: getattr(sv, key) for key in (
                "f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree",
                "f_favail", "f_flag", "f_namemax")}

        def opendir(self, path):
            node = self.state.lookup(self.state.rel(path))
            if not node.is_dir:
                raise _oserror(errno.ENOTDIR)
            return self._fh(node)

        def readdir(self, path, fh):
            node = self._node(path, fh)
            out = [(".", {"st_mode": stat_mod.S_IFDIR}, 0), ("..", {"st_mode": stat_mod.S_IFDIR}, 0)]
            out.extend((name, {"st_mode": stat_mod.S_IFMT(child.mode)}, 0)
                       for name, child in sorted(node.children.items()))
            return out

        def releasedir(self, path, fh):
            return self.release(path, fh)

        def fsyncdir(self, path, datasync, fh):
            self.state.fsync_dir(self._node(path, fh))
            return 0

        def mkdir(self, path, mode):
            uid, gid, _ = mfusepy.fuse_get_context()
            self.state.create(self.state.rel(path), stat_mod.S_IFDIR | stat_mod.S_IMODE(mode), uid, gid, True)
            return 0

        def rmdir(self, path):
            self.state.remove(self.state.rel(path), True)
            return 0

        def unlink(self, path):
            self.state.remove(self.state.rel(path), False)
            return 0

        def rename(self, old, new, flags=0):
            self.state.rename(self.state.rel(old), self.state.rel(new), flags)
            return 0

        def link(self, target, source):
            raise _oserror(errno.ENOTSUP)

        def symlink(self, target, source):
            raise _oserror(errno.ENOTSUP)

        def mknod(self, path, mode, dev):
            raise _oserror(errno.ENOTSUP)

        def create(self, path, mode, flags=0):
            uid, gid, _ = mfusepy.fuse_get_context()
            node = self.state.create(self.state.rel(path), stat_mod.S_IFREG | stat_mod.S_IMODE(mode),
                                     uid, gid, False)
            return self._fh(node)

        def open(self, path, flags):
            node = self.state.lookup(self.state.rel(path))
            if node.is_dir:
                raise _oserror(errno.EISDIR)
            if flags & os.O_TRUNC:   # libfuse3 asks the kernel for atomic O_TRUNC
                self.state.truncate(node, 0)
            if node.cache_fd is None:
                # Hold the durable inode open now: a later unlink or rename-over of the
                # name must not take the content from under this handle.
                self.state._backing_fd(node)
            return self._fh(node)

        def read(self, path, size, offset, fh):
            return self.state.read(self._node(path, fh), size, offset)

        def write(self, path, data, offset, fh):
            return self.state.write(self._node(path, fh), data, offset)

        def truncate(self, path, length, fh=None):
            self.state.truncate(self._node(path, fh), length)
            return 0

        def flush(self, path, fh):
            return 0

        def fsync(self, path, datasync, fh):
            self.state.fsync_file(self._node(path, fh))
            return 0

        def release(self, path, fh):
            node = self.handles.pop(fh, None)
            if node is not None:
                node.opens -= 1
                if node.opens == 0 and node.cache_fd is None and node.backing_fd is not None \
                        and node.linked:
                    os.close(node.backing_fd)   # reopened by path on the next use
                    node.backing_fd = None
                self.state._maybe_drop(node)
            return 0

        def chmod(self, path, mode):
            node = self._node(path, None)
            node.mode = stat_mod.S_IFMT(node.mode) | stat_mod.S_IMODE(mode)
            node.ctime = time.time_ns()
            return 0

        def chown(self, path, uid, gid):
            node = self._node(path, None)
            if uid != -1:
                node.uid = uid
            if gid != -1:
                node.gid = gid
            node.ctime = time.time_ns()
            return 0

        def utimens(self, path, times=None):
            node = self._node(path, None)
            now = time.time_ns()
            node.atime, node.mtime = times if times else (now, now)
            node.ctime = now
            return 0

    class LazyFuse(mfusepy.FUSE):
        # mfusepy's libfuse3 wrappers drop the file handle of truncate and the flags of
        # rename; an open-unlinked file is only reachable by its handle, and
        # RENAME_NOREPLACE must not silently replace.
        def truncate_fuse_3(self, path, length, fip):
            fh = fip.contents.fh if fip else None
            return self.operations.truncate(None if path is None else path.decode(self.encoding, self.errors),
                                            length, fh)

        def rename_fuse_3(self, old, new, flags):
            return self.operations.rename(old.decode(self.encoding, self.errors),
                                          new.decode(self.encoding, self.errors), flags)

    return LazyOps, LazyFuse


def serve(backing: str, mount: str, cache_dir: str | None = None, seed: str | None = None) -> None:
    """Mount and serve until unmounted or killed (foreground, single-threaded)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    LazyOps, LazyFuse = _operations_class()
    own_cache = cache_dir is None
    if own_cache:
        cache_dir = tempfile.mkdtemp(prefix="lazyfs-cache-")
    else:
        os.makedirs(cache_dir, exist_ok=True)
    state = LazyState(backing, cache_dir)
    # SIGTERM (libfuse's handler) unmounts and exits, dropping what was never fsynced.
    # SIGUSR2 is a torn power cut: part of the pending data reaches the disk, then the
    # daemon dies. Python runs the handler at the next request's first bytecode (the
    # sender makes one), so it may fall in the middle of a write, as a real cut does.
    def torn_cut(*_):
        try:
            state.tear(random.Random(seed))
        finally:
            os._exit(0)

    signal.signal(signal.SIGUSR2, torn_cut)
    try:
        LazyFuse(LazyOps(state), mount, foreground=True, nothreads=True,
                 fsname="lazyfs", subtype="lazyfs",
                 attr_timeout=0, entry_timeout=0, negative_timeout=0)
    finally:
        if own_cache:
            shutil.rmtree(cache_dir, ignore_errors=True)


# --------------------------------------------------------------------------------------
# The test-side handle
# --------------------------------------------------------------------------------------

class FuseUnavailable(RuntimeError):
    """FUSE cannot be used here (no /dev/fuse, no fusermount3, no libfuse3, no mfusepy)."""


def fuse_unavailable_reason() -> str | None:
    """None when a PowerCutDisk can start here, else why not (one line)."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian: apt-get install fuse3 libfuse3-3)"
    try:
        import mfusepy  # noqa: F401  (it loads libfuse on import)
    except (ImportError, OSError, EnvironmentError) as exc:
        return f"mfusepy cannot load libfuse: {exc}"
    return None


def _unmount(mount: str) -> None:
    """Lazy unmount (the mount of a killed daemon); quiet when nothing is mounted."""
    if not os.path.ismount(mount):
        try:
            os.stat(mount)
            return
        except OSError:
            pass  # ENOTCONN: a dead FUSE mount is still there
    for cmd in (["fusermount3", "-uz", mount], ["umount", "-l", mount]):
        try:
            if subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
                return
        except FileNotFoundError:
            continue


class PowerCutDisk:
    """A LazyFS-style mount at `mount` backed by `backing`, whose power can be cut.

    start() mounts (blocks until the mount answers); cut() loses everything not
    fsynced (SIGKILL of the daemon + lazy unmount) and mounts a fresh daemon on
    the same backing dir; power_off() is the first half of cut() alone (for a
    test that cuts several disks, then restarts them); stop() unmounts for good
    and, like a cut, drops what was never fsynced; sync() makes everything
    durable (sync(2)), for a test that wants a clean baseline. Processes with
    files open on the mount must be killed before a cut: their descriptors point
    into the dead mount. Use as a context manager to stop on exit.

    Raises FuseUnavailable from start() when FUSE cannot be used here.
    """

    def __init__(self, backing: str | Path, mount: str | Path, log_path: str | Path | None = None,
                 ready_timeout_s: float = 30.0, seed: int | None = None):
        self.backing = Path(backing)
        self.mount = Path(mount)
        self.log_path = Path(log_path) if log_path else self.backing.parent / f"{self.backing.name}.lazyfs.log"
        self.ready_timeout_s = ready_timeout_s
        self.seed = seed       # torn cuts keep the same parts for the same seed and history
        self.starts = 0
        self.proc: subprocess.Popen | None = None
        self.cuts = 0          # daemons killed by power_off() (and so cut() and stop())
        self._cache: str | None = None

    def start(self) -> "PowerCutDisk":
        reason = fuse_unavailable_reason()
        if reason:
            raise FuseUnavailable(reason)
        if self.proc is not None and self.proc.poll() is None:
            return self
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mount.mkdir(parents=True, exist_ok=True)
        _unmount(str(self.mount))
        self._cache = tempfile.mkdtemp(prefix="lazyfs-cache-")
        seed = [] if self.seed is None else ["--seed", f"{self.seed}-{self.starts}"]
        self.starts += 1
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "semel.launch.lazyfs", str(self.backing), str(self.mount),
                 "--cache-dir", self._cache, *seed],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.ready_timeout_s
        while not os.path.ismount(self.mount):
            if self.proc.poll() is not None:
                raise FuseUnavailable(f"lazyfs exited with status {self.proc.returncode} before mounting "
                                      f"(log: {self.log_path}): {self._log_tail()}")
            if time.monotonic() > deadline:
                self.power_off()
                raise FuseUnavailable(f"lazyfs did not mount {self.mount} in {self.ready_timeout_s}s "
                                      f"(log: {self.log_path})")
            time.sleep(0.02)
        return self

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-600:].strip()
        except OSError:
            return ""

    def logged_errors(self) -> list[str]:
        """Error lines the daemons of this disk wrote (an operation that failed inside the
        layer, not one the program on the mount got wrong): a test expects none."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if " ERROR " in line or line.startswith("Traceback")
                or "Uncaught exception" in line]

    @property
    def mounted(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and os.path.ismount(self.mount)

    def power_off(self, torn: bool = False) -> None:
        """The power goes: the daemon dies with everything not fsynced; the mount is detached.

        torn=True: a random part of each file's pending writes reaches the disk first
        (a torn tail, garbage in an index), as a real disk may leave it."""
        if self.proc is not None:
            if self.proc.poll() is None:
                if torn:
                    self.proc.send_signal(signal.SIGUSR2)
                    try:
                        os.stat(self.mount)   # a request, so the daemon runs its handler
                    except OSError:
                        pass
                    try:
                        self.proc.wait(30)
                    except subprocess.TimeoutExpired:
                        self.proc.kill()
                else:
                    self.proc.kill()
                self.cuts += 1
            self.proc.wait()
            self.proc = None
        _unmount(str(self.mount))
        if self._cache:
            shutil.rmtree(self._cache, ignore_errors=True)
            self._cache = None

    def cut(self, torn: bool = False) -> "PowerCutDisk":
        """power_off(torn) and start() again on the same backing dir."""
        self.power_off(torn)
        return self.start()

    def sync(self) -> None:
        """Make every pending change durable (like sync(2)): fsync every file, then every
        directory, deepest first, through the mount."""
        dirs = []
        for root, _subdirs, files in os.walk(self.mount):
            dirs.append(root)
            for name in files:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        for path in reversed(dirs):
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def stop(self) -> None:
        self.power_off()

    def __enter__(self) -> "PowerCutDisk":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m semel.launch.lazyfs", description=__doc__.split("\n\n")[0])
    parser.add_argument("backing", help="directory that holds only what was fsynced")
    parser.add_argument("mount", help="where to mount the power-cut view of it")
    parser.add_argument("--cache-dir", help="scratch directory for pending file content (default: a temp dir)")
    parser.add_argument("--seed", help="seed of what a torn cut (SIGUSR2) keeps (default: random)")
    args = parser.parse_args(argv)
    serve(args.backing, args.mount, args.cache_dir, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
