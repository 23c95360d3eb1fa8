"""The power-cut file system's FUSE glue (semel.launch.lazyfs): the operations libfuse
calls, each a thin wrapper over the namespace (lazyfs_tree) and its page cache, and
`serve`, the daemon's main loop.
"""
from __future__ import annotations

import errno
import logging
import os
import random
import shutil
import signal
import stat as stat_mod
import tempfile
import time

from .lazyfs_pages import Node, oserror
from .lazyfs_tree import LazyState


def _operations_class():
    import mfusepy

    class LazyOps(mfusepy.Operations):
        use_ns = True
        flag_nopath = True       # ops on an open file get its handle, not a path
        flag_nullpath_ok = True

        def __init__(self, state: LazyState):
            self.state = state
            self.handles: dict[int, Node] = {}
            self.next_fh = 1

        def _fh(self, node: Node) -> int:
            fh = self.next_fh
            self.next_fh += 1
            self.handles[fh] = node
            node.opens += 1
            return fh

        def _node(self, path, fh) -> Node:
            if fh:
                node = self.handles.get(fh)
                if node is not None:
                    return node
            if path is None:
                raise oserror(errno.EBADF)
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
                raise oserror(errno.ENOTDIR)
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
            raise oserror(errno.ENOTSUP)

        def symlink(self, target, source):
            raise oserror(errno.ENOTSUP)

        def mknod(self, path, mode, dev):
            raise oserror(errno.ENOTSUP)

        def create(self, path, mode, flags=0):
            uid, gid, _ = mfusepy.fuse_get_context()
            node = self.state.create(self.state.rel(path), stat_mod.S_IFREG | stat_mod.S_IMODE(mode),
                                     uid, gid, False)
            return self._fh(node)

        def open(self, path, flags):
            node = self.state.lookup(self.state.rel(path))
            if node.is_dir:
                raise oserror(errno.EISDIR)
            if flags & os.O_TRUNC:   # libfuse3 asks the kernel for atomic O_TRUNC
                self.state.pages.truncate(node, 0)
            if node.cache_fd is None:
                # Hold the durable inode open now: a later unlink or rename-over of the
                # name must not take the content from under this handle.
                self.state.pages.backing_fd(node)
            return self._fh(node)

        def read(self, path, size, offset, fh):
            return self.state.pages.read(self._node(path, fh), size, offset)

        def write(self, path, data, offset, fh):
            return self.state.pages.write(self._node(path, fh), data, offset)

        def truncate(self, path, length, fh=None):
            self.state.pages.truncate(self._node(path, fh), length)
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
                self.state.maybe_drop(node)
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
