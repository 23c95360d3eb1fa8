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

This module is the test-side handle (`PowerCutDisk`) and the daemon's entry point;
the daemon is lazyfs_tree (the namespace and its log of pending changes),
lazyfs_pages (pending file content) and lazyfs_fuse (the FUSE operations).
"""
from __future__ import annotations
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .lazyfs_fuse import serve


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
