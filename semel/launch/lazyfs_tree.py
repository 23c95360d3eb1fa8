"""The power-cut file system's namespace (semel.launch.lazyfs): a volatile tree of
nodes, each knowing where it lives durably, and the log of namespace changes (create,
mkdir, unlink, rmdir, rename) not made durable yet, applied to the backing dir on the
fsync that makes each durable. File content is the page cache's (lazyfs_pages).
"""
from __future__ import annotations

import errno
import logging
import os
import random
import stat as stat_mod
import time

from .lazyfs_pages import Node, PageCache, oserror

log = logging.getLogger("semel.lazyfs")

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


class Op:
    """One pending namespace change, with the volatile paths it had when it was made."""
    __slots__ = ("kind", "paths", "dirs", "node", "replaced", "mode", "hide")

    def __init__(self, kind: str, paths: tuple[str, ...], dirs: tuple[Node, ...], node: Node,
                 replaced: Node | None = None, mode: int = 0o644):
        self.kind = kind
        self.paths = paths
        self.dirs = dirs
        self.node = node
        self.replaced = replaced
        self.mode = mode
        self.hide = False

    def conflicts(self, other: "Op") -> bool:
        for a in self.paths:
            for b in other.paths:
                if a == b or a.startswith(b + "/") or b.startswith(a + "/"):
                    return True
        return False



class LazyState:
    """The daemon's namespace: the volatile tree and the log of pending changes to it.

    Paths here are relative to the mount root without a leading slash ("" is the root)."""

    def __init__(self, backing: str, cache_dir: str):
        self.backing = os.path.abspath(backing)
        self.pages = PageCache(self.backing, cache_dir)
        self.next_ino = 1
        self.ops: list[Op] = []
        self.at_dpath: dict[str, Node] = {}
        # libfuse keeps an open file it is asked to unlink (or rename over) reachable
        # by renaming it to .fuse_hiddenNNN; to us that is an unlink, and the hidden
        # name is only a way to find the node until its last handle closes.
        self.hidden: dict[str, Node] = {}
        st = os.stat(self.backing)
        self.root = self._new(True, st.st_mode, st.st_uid, st.st_gid)
        self._from_stat(self.root, st)
        self.root.dpath = ""
        self.at_dpath[""] = self.root
        self._load(self.root, "")

    # -- building ----------------------------------------------------------------------
    def _new(self, is_dir: bool, mode: int, uid: int, gid: int) -> Node:
        node = Node(self.next_ino, is_dir, mode, uid, gid, time.time_ns())
        self.next_ino += 1
        return node

    @staticmethod
    def _from_stat(node: Node, st: os.stat_result) -> None:
        node.atime, node.mtime, node.ctime = st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns
        node.size = 0 if node.is_dir else st.st_size

    def _load(self, directory: Node, rel: str) -> None:
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
    def _attach(directory: Node, name: str, node: Node) -> None:
        directory.children[name] = node
        node.parent = directory
        node.name = name

    # -- lookups -----------------------------------------------------------------------
    @staticmethod
    def rel(path: str) -> str:
        return path.strip("/")

    def lookup(self, rel: str) -> Node:
        hidden = self.hidden.get(rel)
        if hidden is not None:
            return hidden
        node = self.root
        if rel:
            for part in rel.split("/"):
                if not node.is_dir:
                    raise oserror(errno.ENOTDIR)
                node = node.children.get(part)
                if node is None:
                    raise oserror(errno.ENOENT)
        return node

    def parent_of(self, rel: str) -> tuple[Node, str]:
        head, _, name = rel.rpartition("/")
        if not name:
            raise oserror(errno.EEXIST)
        parent = self.lookup(head)
        if not parent.is_dir:
            raise oserror(errno.ENOTDIR)
        return parent, name

    # -- attributes --------------------------------------------------------------------
    def attrs(self, node: Node) -> dict:
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

    def maybe_drop(self, node: Node) -> None:
        if not node.linked and node.opens == 0 and not node.is_dir:
            self.pages.drop(node)

    # -- namespace changes (pending) --------------------------------------------------------
    def create(self, rel: str, mode: int, uid: int, gid: int, is_dir: bool) -> Node:
        parent, name = self.parent_of(rel)
        if name in parent.children:
            raise oserror(errno.EEXIST)
        node = self._new(is_dir, mode, uid, gid)
        if not is_dir:
            self.pages.ensure(node)
        self._attach(parent, name, node)
        parent.mtime = parent.ctime = node.ctime
        self.ops.append(Op("mkdir" if is_dir else "create", (rel,), (parent,), node,
                            mode=stat_mod.S_IMODE(mode)))
        return node

    def remove(self, rel: str, is_dir: bool) -> None:
        hidden = self.hidden.pop(rel, None)
        if hidden is not None:           # the last handle of an unlinked file closed
            self.maybe_drop(hidden)
            return
        parent, name = self.parent_of(rel)
        node = parent.children.get(name)
        if node is None:
            raise oserror(errno.ENOENT)
        if is_dir and not node.is_dir:
            raise oserror(errno.ENOTDIR)
        if not is_dir and node.is_dir:
            raise oserror(errno.EISDIR)
        if is_dir and node.children:
            raise oserror(errno.ENOTEMPTY)
        del parent.children[name]
        node.parent = None
        node.linked = False
        parent.mtime = parent.ctime = time.time_ns()
        self.ops.append(Op("rmdir" if is_dir else "unlink", (rel,), (parent,), node))
        self.maybe_drop(node)

    def rename(self, old: str, new: str, flags: int) -> None:
        if flags & _RENAME_EXCHANGE:
            raise oserror(errno.EINVAL)
        if new.rpartition("/")[2].startswith(".fuse_hidden"):
            node = self.lookup(old)
            self.remove(old, node.is_dir)
            self.ops[-1].hide = True
            self.hidden[new] = node
            return
        src_parent, src_name = self.parent_of(old)
        node = src_parent.children.get(src_name)
        if node is None:
            raise oserror(errno.ENOENT)
        dst_parent, dst_name = self.parent_of(new)
        if node.is_dir:  # no directory into its own subtree
            walk = dst_parent
            while walk is not None:
                if walk is node:
                    raise oserror(errno.EINVAL)
                walk = walk.parent
        target = dst_parent.children.get(dst_name)
        if target is node:
            return
        if target is not None:
            if flags & _RENAME_NOREPLACE:
                raise oserror(errno.EEXIST)
            if target.is_dir and not node.is_dir:
                raise oserror(errno.EISDIR)
            if node.is_dir and not target.is_dir:
                raise oserror(errno.ENOTDIR)
            if target.is_dir and target.children:
                raise oserror(errno.ENOTEMPTY)
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
        self.ops.append(Op("rename", (old, new), dirs, node, replaced=target))
        if target is not None:
            self.maybe_drop(target)

    # -- making things durable ------------------------------------------------------------
    def _commit(self, wanted) -> None:
        """Apply to the backing dir the pending ops for which wanted(op) holds, with every
        earlier op they depend on (one on an overlapping path), in log order."""
        chosen: list[Op] = []
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
                self.pages.drop(op.node)   # unlinked and closed: only its name is left to commit

    def _apply(self, op: Op) -> None:
        b = self.backing
        if op.kind == "create":
            path = op.paths[0]
            fd = os.open(os.path.join(b, path), os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, op.mode)
            self._unmap(path)
            self._map(path, op.node)
            self.pages.adopt(op.node, fd)
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

    def _map(self, path: str, node: Node) -> None:
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
        """A torn power cut: part of the pending data of every durably named file is written."""
        self.pages.tear(self.at_dpath.values(), rng)

    def _commit_entry(self, node: Node) -> None:
        if node.dpath is None:
            self._commit(lambda op: op.node is node)

    def fsync_file(self, node: Node) -> None:
        self._commit_entry(node)
        if not node.is_dir:
            self.pages.flush(node)

    def fsync_dir(self, node: Node) -> None:
        self._commit_entry(node)
        self._commit(lambda op: any(d is node for d in op.dirs))

