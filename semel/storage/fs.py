"""The file-system seam: every byte storage reads or writes goes through a `FileSystem`.

Why a seam: the promises storage makes (an append is all-or-nothing, a failed
fsync changes nothing, a crash leaves the old or the new catalogue) are only
believable when tests can make the disk fail on purpose at each step.
`FaultyFileSystem` does that, in-process for unit tests and, through
`fs_from_env()` and the SEMEL_FS_FAULTS variable, inside a broker process for
chaos runs. A broker started with `control_file=PATH` in SEMEL_FS_FAULTS also
takes faults while it runs (test-only): write a spec in the same syntax to PATH
(atomically: tmp + rename); the file system arms it within ~10 ms and deletes
PATH, so a test that waits for PATH to vanish knows the next matching operation
fails. `clear=1` in such a spec first disarms everything. A spec it cannot parse
is moved to PATH.rejected instead.

Files are addressed by `FileHandle` (fd + path) so that faults can be aimed at
paths ("fail the next write to a .log file") and counted per path.
All methods raise OSError on failure, never anything else.
"""
from __future__ import annotations

import errno
import mmap
import os
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Mapping, TypedDict, cast


class FileHandle:
    __slots__ = ("fd", "path")

    def __init__(self, fd: int, path: str):
        self.fd = fd
        self.path = path

    def __repr__(self) -> str:
        return f"FileHandle({self.fd}, {self.path!r})"


class FileSystem:
    """Plain POSIX I/O. Positions are explicit (pread/pwrite): storage tracks sizes itself."""

    # -- file handles --------------------------------------------------------------
    def open(self, path: str | Path, *, create: bool = True) -> FileHandle:
        flags = os.O_RDWR | (os.O_CREAT if create else 0) | getattr(os, "O_CLOEXEC", 0)
        return FileHandle(os.open(path, flags, 0o644), str(path))

    def close(self, f: FileHandle) -> None:
        if f.fd >= 0:
            fd, f.fd = f.fd, -1
            os.close(fd)

    def pwrite(self, f: FileHandle, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Write all of data at offset (loops over short writes)."""
        view = memoryview(data)
        while view:
            n = os.pwrite(f.fd, view, offset)
            view = view[n:]
            offset += n

    def append(self, f: FileHandle, data: bytes | bytearray | memoryview) -> int:
        """Write data at the current end of the file; returns the position written at."""
        pos = self.size(f)
        self.pwrite(f, data, pos)
        return pos

    def pread(self, f: FileHandle, size: int, offset: int) -> bytes:
        """Up to size bytes at offset (fewer only at end of file)."""
        out = os.pread(f.fd, size, offset)
        if len(out) < size:  # a short read before EOF is legal: keep reading
            parts = [out]
            got = len(out)
            while got < size:
                more = os.pread(f.fd, size - got, offset + got)
                if not more:
                    break
                parts.append(more)
                got += len(more)
            out = b"".join(parts)
        return out

    def size(self, f: FileHandle) -> int:
        return os.fstat(f.fd).st_size

    def fsync(self, f: FileHandle) -> None:
        os.fsync(f.fd)

    def truncate(self, f: FileHandle, size: int) -> None:
        os.ftruncate(f.fd, size)

    def map_readonly(self, f: FileHandle, length: int) -> mmap.mmap:
        """A read-only map of the first length bytes (length > 0). Used by recovery scans."""
        return mmap.mmap(f.fd, length, access=mmap.ACCESS_READ)

    # -- paths ---------------------------------------------------------------------
    def fsync_dir(self, path: str | Path) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def rename(self, src: str | Path, dst: str | Path) -> None:
        os.replace(src, dst)

    def unlink(self, path: str | Path, *, missing_ok: bool = True) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def listdir(self, path: str | Path) -> list[str]:
        return sorted(os.listdir(path))

    def makedirs(self, path: str | Path) -> None:
        os.makedirs(path, exist_ok=True)

    def rmtree(self, path: str | Path) -> None:
        shutil.rmtree(path, ignore_errors=False)

    def exists(self, path: str | Path) -> bool:
        return os.path.exists(path)

    def is_dir(self, path: str | Path) -> bool:
        return os.path.isdir(path)

    def file_size(self, path: str | Path) -> int:
        return os.stat(path).st_size

    def mtime_ms(self, path: str | Path) -> int:
        return int(os.stat(path).st_mtime * 1000)

    def read_file(self, path: str | Path) -> bytes:
        f = self.open(path, create=False)
        try:
            return self.pread(f, self.size(f), 0)
        finally:
            self.close(f)

    def write_atomic(self, path: str | Path, data: bytes, *, sync_dir: bool = True) -> None:
        """Replace path with data so that a crash leaves the old or the new content.

        tmp + fsync + rename (+ fsync of the directory so the rename itself is
        durable). On failure the temp file is removed and the old file is untouched.
        """
        path = str(path)
        tmp = path + ".tmp"
        f = self.open(tmp)
        try:
            try:
                self.truncate(f, 0)
                self.pwrite(f, data, 0)
                self.fsync(f)
            finally:
                self.close(f)
            self.rename(tmp, path)
        except BaseException:
            try:
                self.unlink(tmp)
            except OSError:
                pass
            raise
        if sync_dir:
            self.fsync_dir(os.path.dirname(path) or ".")


class _Fault:
    """n more failures of one operation, optionally only for paths containing a substring,
    after letting `skip` matching calls through (to aim at the 2nd, 3rd... such call).
    `partial`: a failed write is torn; `drop`: a failed fsync loses the file's unsynced bytes."""

    __slots__ = ("remaining", "path_contains", "partial", "skip", "drop")

    def __init__(self, n: int, path_contains: str | None, partial: bool = False, skip: int = 0,
                 drop: bool = False):
        self.remaining = n
        self.path_contains = path_contains
        self.partial = partial
        self.skip = skip
        self.drop = drop

    def hits(self, path: str) -> bool:
        return self.remaining > 0 and (self.path_contains is None or self.path_contains in path)


class FaultyFileSystem(FileSystem):
    """A FileSystem that fails on request and counts what it was asked to do.

    - fail_next_write(n, path_contains, partial): the next n matching pwrites raise EIO;
      with partial=True half of the bytes reach the file first (a torn write).
    - fail_next_fsync / fail_next_rename: the next n matching calls raise EIO
      (fsync_dir counts as an fsync of the directory path). fail_next_fsync(drop=True)
      also models what Linux may do to the pages of a failed fsync ("fsyncgate": it
      marks them clean and reports the error once, so they are lost at the next power
      cut or eviction while a later fsync succeeds): every byte written to the file
      since its last successful fsync is zeroed in the file before the error is
      raised, as a reader would find it once the page cache let go of them.
    - fsync_delay_s: every fsync sleeps first (a slow disk).
    - enospc_after_bytes: once that many bytes were added to files, writes raise
      ENOSPC after writing what still fits; truncate and unlink give space back.
    - counts: Counter of (operation, path); see count().
    """

    def __init__(self, *, fsync_delay_s: float = 0.0, enospc_after_bytes: int | None = None):
        self.fsync_delay_s = fsync_delay_s
        self.enospc_after_bytes = enospc_after_bytes
        self.counts: Counter[tuple[str, str]] = Counter()
        self._used = 0
        self._lock = threading.Lock()
        self._faults: dict[str, list[_Fault]] = {"write": [], "fsync": [], "rename": []}
        # Per path, the (start, end) byte ranges written since its last successful fsync
        # (adjacent and overlapping ones merged): what a dropping fsync failure zeroes.
        self._unsynced: dict[str, list[tuple[int, int]]] = {}

    # -- arming faults ---------------------------------------------------------
    def fail_next_write(self, n: int = 1, path_contains: str | None = None, *, partial: bool = False,
                        skip: int = 0) -> None:
        with self._lock:
            self._faults["write"].append(_Fault(n, path_contains, partial, skip))

    def fail_next_fsync(self, n: int = 1, path_contains: str | None = None, *, skip: int = 0,
                        drop: bool = False) -> None:
        with self._lock:
            self._faults["fsync"].append(_Fault(n, path_contains, skip=skip, drop=drop))

    def fail_next_rename(self, n: int = 1, path_contains: str | None = None, *, skip: int = 0) -> None:
        with self._lock:
            self._faults["rename"].append(_Fault(n, path_contains, skip=skip))

    def clear_faults(self) -> None:
        with self._lock:
            for faults in self._faults.values():
                faults.clear()
            self.enospc_after_bytes = None

    def count(self, op: str, path_contains: str | None = None) -> int:
        """How many times op ('pwrite', 'pread', 'fsync', 'rename', 'truncate', 'unlink') ran or was tried."""
        with self._lock:
            return sum(n for (o, p), n in self.counts.items()
                       if o == op and (path_contains is None or path_contains in p))

    def _take(self, op: str, path: str) -> _Fault | None:
        with self._lock:
            self.counts[(op if op != "write" else "pwrite", path)] += 1
            for fault in self._faults[op]:
                if fault.hits(path):
                    if fault.skip:
                        fault.skip -= 1
                        continue
                    fault.remaining -= 1
                    return fault
        return None

    # -- intercepted operations ----------------------------------------------------
    def pwrite(self, f: FileHandle, data: bytes | bytearray | memoryview, offset: int) -> None:
        fault = self._take("write", f.path)
        if fault is not None:
            if fault.partial and len(data) > 1:
                self._note_unsynced(f.path, offset, len(data) // 2)
                super().pwrite(f, memoryview(data)[: len(data) // 2], offset)
            raise OSError(errno.EIO, "injected write failure", f.path)
        self._note_unsynced(f.path, offset, len(data))
        if self.enospc_after_bytes is not None:
            self._write_with_quota(f, data, offset, self.enospc_after_bytes)
            return
        super().pwrite(f, data, offset)

    def _note_unsynced(self, path: str, start: int, size: int) -> None:
        end = start + size
        with self._lock:
            ranges = self._unsynced.setdefault(path, [])
            if ranges and start <= ranges[-1][1] and end >= ranges[-1][0]:
                last = ranges.pop()
                start, end = min(start, last[0]), max(end, last[1])
            ranges.append((start, end))

    def _drop_unsynced(self, f: FileHandle) -> None:
        """A failed fsync lost the pages written since the last good one: zero them
        (within the file's current size), bypassing faults and counts."""
        with self._lock:
            ranges = self._unsynced.pop(f.path, [])
        size = super().size(f)
        for start, end in ranges:
            end = min(end, size)
            if end > start:
                super().pwrite(f, bytes(end - start), start)

    def _write_with_quota(self, f: FileHandle, data: bytes | bytearray | memoryview, offset: int,
                          quota: int) -> None:
        old_size = self.size(f)
        growth = max(0, offset + len(data) - old_size)
        with self._lock:
            room = quota - self._used
            fits = growth <= room
            self._used += growth if fits else max(room, 0)
        if fits:
            super().pwrite(f, data, offset)
            return
        keep = max(0, old_size + max(room, 0) - offset)  # write what still fits, like a full disk
        if keep:
            super().pwrite(f, memoryview(data)[:keep], offset)
        raise OSError(errno.ENOSPC, "injected full disk", f.path)

    def pread(self, f: FileHandle, size: int, offset: int) -> bytes:
        with self._lock:
            self.counts[("pread", f.path)] += 1
        return super().pread(f, size, offset)

    def truncate(self, f: FileHandle, size: int) -> None:
        with self._lock:
            self.counts[("truncate", f.path)] += 1
        old = self.size(f)
        super().truncate(f, size)
        if old > size:
            with self._lock:
                self._used = max(0, self._used - (old - size))

    def unlink(self, path: str | Path, *, missing_ok: bool = True) -> None:
        with self._lock:
            self.counts[("unlink", str(path))] += 1
        try:
            freed = os.stat(path).st_size
        except OSError:
            freed = 0
        super().unlink(path, missing_ok=missing_ok)
        with self._lock:
            self._used = max(0, self._used - freed)

    def fsync(self, f: FileHandle) -> None:
        fault = self._fsync_common(f.path)
        if fault is not None:
            if fault.drop:
                self._drop_unsynced(f)
            raise OSError(errno.EIO, "injected fsync failure", f.path)
        with self._lock:
            self._unsynced.pop(f.path, None)
        super().fsync(f)

    def fsync_dir(self, path: str | Path) -> None:
        if self._fsync_common(str(path)) is not None:
            raise OSError(errno.EIO, "injected fsync failure", str(path))
        super().fsync_dir(path)

    def _fsync_common(self, path: str) -> _Fault | None:
        """Sleep as asked; the armed fault this fsync takes, if any."""
        if self.fsync_delay_s:
            time.sleep(self.fsync_delay_s)
        return self._take("fsync", path)

    def rename(self, src: str | Path, dst: str | Path) -> None:
        if self._take("rename", str(src)) is not None:
            raise OSError(errno.EIO, "injected rename failure", str(src))
        super().rename(src, dst)

    # -- test-only: faults armed at a chosen moment of a running process ------------
    def watch_control_file(self, path: str | Path, poll_s: float = 0.01) -> None:
        """Poll path from a daemon thread; see the module docstring for the protocol.
        The thread uses os directly, so it is neither counted nor hit by faults."""
        path = str(path)

        def poll() -> None:
            while True:
                time.sleep(poll_s)
                try:
                    with open(path) as f:
                        spec = f.read()
                except OSError:       # not there (yet)
                    continue
                try:
                    opts = parse_fault_spec(spec)
                except ValueError:
                    os.replace(path, path + ".rejected")
                    continue
                arm_faults(self, opts)
                os.unlink(path)       # the acknowledgement the test waits for

        threading.Thread(target=poll, name="fs-fault-control", daemon=True).start()


class FaultSpec(TypedDict, total=False):
    """A parsed SEMEL_FS_FAULTS spec: the keys of _ENV_KEYS, each of its kind."""
    fsync_delay_ms: int
    enospc_after_bytes: int
    fail_next_write: int
    fail_next_fsync: int
    fail_next_rename: int
    path_contains: str
    partial: int
    drop: int
    skip: int
    clear: int
    control_file: str


# Keys accepted in SEMEL_FS_FAULTS and how to parse each value.
_ENV_KEYS: dict[str, Callable[[str], int | str]] = {
    "fsync_delay_ms": int,
    "enospc_after_bytes": int,
    "fail_next_write": int,
    "fail_next_fsync": int,
    "fail_next_rename": int,
    "path_contains": str,
    "partial": int,          # 1: a failed write first puts half of its bytes in the file (torn write)
    "drop": int,             # 1: a failed fsync zeroes what the file got since its last good fsync (fsyncgate)
    "skip": int,             # let this many matching calls succeed before the failures begin
    "clear": int,            # 1: disarm all faults before arming the rest (control file only)
    "control_file": str,     # test-only: a file polled for more specs while the process runs
}


def parse_fault_spec(spec: str) -> FaultSpec:
    """'fsync_delay_ms=50,enospc_after_bytes=1000000' -> {'fsync_delay_ms': 50, ...}."""
    out: dict[str, int | str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in _ENV_KEYS:
            raise ValueError(f"SEMEL_FS_FAULTS: bad entry {part!r}; known keys: {', '.join(_ENV_KEYS)}")
        try:
            parsed = _ENV_KEYS[key](value.strip())
        except ValueError:
            raise ValueError(f"SEMEL_FS_FAULTS: {key} needs an integer, got {value!r}") from None
        if isinstance(parsed, int) and parsed < 0:
            raise ValueError(f"SEMEL_FS_FAULTS: {key} must not be negative")
        out[key] = parsed
    # Every key is one of FaultSpec's and its value parsed to that key's kind by _ENV_KEYS,
    # which a checker cannot follow through a key known only at run time.
    return cast(FaultSpec, out)


def fs_from_env(environ: Mapping[str, str] | None = None) -> FileSystem:
    """FileSystem for a broker process: faulty when SEMEL_FS_FAULTS is set, plain otherwise."""
    spec = (os.environ if environ is None else environ).get("SEMEL_FS_FAULTS", "").strip()
    if not spec:
        return FileSystem()
    opts = parse_fault_spec(spec)
    fs = FaultyFileSystem(fsync_delay_s=opts.get("fsync_delay_ms", 0) / 1000.0,
                          enospc_after_bytes=opts.get("enospc_after_bytes"))
    arm_faults(fs, opts)
    if opts.get("control_file"):
        fs.watch_control_file(opts["control_file"])
    return fs


def arm_faults(fs: FaultyFileSystem, opts: FaultSpec) -> None:
    """Apply parsed spec options to fs (clear first when asked)."""
    if opts.get("clear"):
        fs.clear_faults()
        fs.fsync_delay_s = 0.0
    if "fsync_delay_ms" in opts:
        fs.fsync_delay_s = opts["fsync_delay_ms"] / 1000.0
    if "enospc_after_bytes" in opts:
        fs.enospc_after_bytes = opts["enospc_after_bytes"]
    where = opts.get("path_contains")
    skip = opts.get("skip", 0)
    if n := opts.get("fail_next_write", 0):
        fs.fail_next_write(n, where, partial=bool(opts.get("partial")), skip=skip)
    if n := opts.get("fail_next_fsync", 0):
        fs.fail_next_fsync(n, where, skip=skip, drop=bool(opts.get("drop")))
    if n := opts.get("fail_next_rename", 0):
        fs.fail_next_rename(n, where, skip=skip)
