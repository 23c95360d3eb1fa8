"""The power-cut file system (semel.launch.lazyfs): what survives a cut is exactly what
was fsynced, and processes on the mount see their own pending changes meanwhile."""
from __future__ import annotations

import mmap
import os
import random

import pytest

from tests.support.powercut import disk, power_cut_disk  # noqa: F401  (disk: a fixture)


def write_file(path, data: bytes, *, fsync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_path(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def durable_file(disk, name: str, data: bytes):
    """A file already durable (data and entry) on the disk."""
    write_file(disk.mount / name, data, fsync=True)
    fsync_path(disk.mount)
    return disk.mount / name


def test_unsynced_write_is_lost_and_synced_write_kept(disk):
    kept = durable_file(disk, "kept", b"one")
    lost = durable_file(disk, "lost", b"one")
    with open(kept, "ab") as f:
        f.write(b"two")
        f.flush()
        os.fsync(f.fileno())
    with open(lost, "ab") as f:
        f.write(b"two")
    assert read(lost) == b"onetwo"          # the writer's own view has it
    disk.cut()
    assert read(kept) == b"onetwo"
    assert read(lost) == b"one"


def test_new_file_needs_its_directory_fsync_or_its_own(disk):
    m = disk.mount
    write_file(m / "never", b"x", fsync=False)
    write_file(m / "dir-only", b"x", fsync=False)
    fd = os.open(m, os.O_RDONLY)
    os.fsync(fd)                            # makes "never" and "dir-only" entries durable ...
    os.close(fd)
    write_file(m / "after-dir-sync", b"x", fsync=False)
    write_file(m / "file-sync", b"data", fsync=True)   # ext4: its own entry comes along
    assert sorted(os.listdir(m)) == ["after-dir-sync", "dir-only", "file-sync", "never"]
    disk.cut()
    assert sorted(os.listdir(m)) == ["dir-only", "file-sync", "never"]
    assert read(m / "dir-only") == b""      # ... but not their data
    assert read(m / "file-sync") == b"data"


def test_mkdir_held_until_parent_fsync(disk):
    m = disk.mount
    os.mkdir(m / "a")
    os.mkdir(m / "b")
    write_file(m / "b" / "f", b"x", fsync=True)   # needs b, so makes b durable too
    disk.cut()
    assert sorted(os.listdir(m)) == ["b"]
    assert read(m / "b" / "f") == b"x"


def test_rename_held_until_directory_fsync(disk):
    m = disk.mount
    durable_file(disk, "a", b"old-a")
    durable_file(disk, "target", b"old-target")
    os.rename(m / "a", m / "b")
    fsync_path(m / "b")                     # a file fsync does not carry a rename of a durable file
    assert sorted(os.listdir(m)) == ["b", "target"]
    disk.cut()
    assert sorted(os.listdir(m)) == ["a", "target"]
    os.rename(m / "a", m / "target")        # over an existing file
    fsync_path(m)
    disk.cut()
    assert os.listdir(m) == ["target"]
    assert read(m / "target") == b"old-a"


def test_rename_over_existing_keeps_old_content_until_directory_fsync(disk):
    m = disk.mount
    durable_file(disk, "ckpt", b"old")
    write_file(m / "ckpt.tmp", b"new", fsync=True)
    os.replace(m / "ckpt.tmp", m / "ckpt")
    assert read(m / "ckpt") == b"new"
    disk.cut()
    assert read(m / "ckpt") == b"old"
    # ckpt.tmp's entry became durable with its fsync, the rename did not
    assert read(m / "ckpt.tmp") == b"new"


def test_cross_directory_rename_is_durable_with_either_directory(disk):
    m = disk.mount
    os.mkdir(m / "src")
    os.mkdir(m / "dst")
    fsync_path(m)
    write_file(m / "src" / "f", b"f", fsync=True)
    os.rename(m / "src" / "f", m / "dst" / "f")
    fsync_path(m / "dst")
    disk.cut()
    assert os.listdir(m / "src") == [] and os.listdir(m / "dst") == ["f"]


def test_directory_rename_and_rmdir_held(disk):
    m = disk.mount
    os.mkdir(m / "d")
    os.mkdir(m / "gone")
    fsync_path(m)
    write_file(m / "d" / "f", b"f", fsync=True)
    os.rename(m / "d", m / "e")
    os.rmdir(m / "gone")
    assert os.listdir(m) == ["e"] and os.listdir(m / "e") == ["f"]
    disk.cut()
    assert sorted(os.listdir(m)) == ["d", "gone"]
    os.rename(m / "d", m / "e")
    os.rmdir(m / "gone")
    fsync_path(m)
    disk.cut()
    assert os.listdir(m) == ["e"] and read(m / "e" / "f") == b"f"


def test_truncate_and_unlink_held(disk):
    m = disk.mount
    durable_file(disk, "t", b"0123456789")
    durable_file(disk, "ft", b"0123456789")
    durable_file(disk, "u", b"u")
    os.truncate(m / "t", 3)
    with open(m / "ft", "r+b") as f:
        os.ftruncate(f.fileno(), 4)
        f.seek(8)
        f.write(b"Z")                       # regrow: the gap must read as zeros
        f.flush()
        os.fsync(f.fileno())
    os.unlink(m / "u")
    assert read(m / "t") == b"012" and not (m / "u").exists()
    disk.cut()
    assert read(m / "t") == b"0123456789"
    assert read(m / "ft") == b"0123\0\0\0\0Z"
    assert read(m / "u") == b"u"
    os.unlink(m / "u")
    fsync_path(m)
    disk.cut()
    assert not (m / "u").exists()


def test_o_trunc_held(disk):
    m = disk.mount
    durable_file(disk, "f", b"old content")
    with open(m / "f", "wb") as f:           # O_TRUNC
        f.write(b"n")
    assert read(m / "f") == b"n"
    disk.cut()
    assert read(m / "f") == b"old content"


def test_reads_stat_and_listing_see_pending_state(disk):
    m = disk.mount
    os.mkdir(m / "d")
    write_file(m / "d" / "f", b"x" * 5000, fsync=False)
    with open(m / "d" / "f", "r+b") as f:
        f.seek(4998)
        f.write(b"yz!")
    assert os.listdir(m) == ["d"] and os.listdir(m / "d") == ["f"]
    assert os.stat(m / "d" / "f").st_size == 5001
    assert read(m / "d" / "f") == b"x" * 4998 + b"yz!"
    assert os.listdir(disk.backing) == []   # nothing reached the disk


def test_open_file_survives_rename_and_unlink(disk):
    m = disk.mount
    durable_file(disk, "seg", b"base")
    f = open(m / "seg", "r+b")
    os.rename(m / "seg", m / "seg.renamed")
    f.seek(0, 2)
    f.write(b"+more")
    f.flush()
    os.fsync(f.fileno())                    # data goes to the durable inode, still named "seg"
    g = open(m / "seg.renamed", "rb")
    os.unlink(m / "seg.renamed")
    assert g.read() == b"base+more"         # open-unlinked: still readable
    f.write(b"!")
    f.flush()
    assert os.fstat(f.fileno()).st_size == 10
    f.close()
    g.close()
    assert os.listdir(m) == []
    disk.cut()
    assert os.listdir(m) == ["seg"]
    assert read(m / "seg") == b"base+more"


def test_read_only_mmap_of_a_file_works(disk):
    m = disk.mount
    data = bytes(range(256)) * 64
    durable_file(disk, "00000000000000000000.log", data)
    with open(m / "00000000000000000000.log", "r+b") as f:
        f.seek(0, 2)
        f.write(b"pending")
        f.flush()
        with mmap.mmap(f.fileno(), len(data) + 7, access=mmap.ACCESS_READ) as mm:
            assert mm[: len(data)] == data
            assert mm[len(data):] == b"pending"


def test_power_off_then_start_is_a_cut(disk):
    m = disk.mount
    write_file(m / "f", b"x", fsync=False)
    disk.power_off()
    assert not disk.mounted
    disk.start()
    assert disk.mounted and os.listdir(m) == []


def test_sync_makes_everything_durable(disk):
    m = disk.mount
    os.makedirs(m / "a" / "b")
    write_file(m / "a" / "b" / "f", b"deep", fsync=False)
    write_file(m / "top", b"top", fsync=False)
    disk.sync()
    disk.cut()
    assert read(m / "a" / "b" / "f") == b"deep" and read(m / "top") == b"top"


# -- a seeded random model: any sequence of operations, then a cut ------------------------

DIRS = ("", "p0", "p1")
NAMES = ("a", "b", "c", "d")


class DurableModel:
    """What must be on disk after a cut, by the layer's documented rules: a file's data at
    its fsync, a namespace change at its directory's fsync (the runs below fsync the
    directory before a file whose entry is not yet durable, so that rule is all they need)."""

    def __init__(self):
        self.vol_names: dict[str, int] = {}
        self.dur_names: dict[str, int] = {}
        self.vol_data: dict[int, bytearray] = {}
        self.dur_data: dict[int, bytes] = {}
        self.pending: list[tuple] = []      # (dir, op, args)
        self.next_id = 0

    def cut(self) -> None:
        self.vol_names = dict(self.dur_names)
        self.vol_data = {i: bytearray(self.dur_data[i]) for i in self.dur_names.values()}
        self.pending = []

    def commit_dir(self, d: str) -> None:
        keep = []
        for op in self.pending:
            if op[0] != d:
                keep.append(op)
                continue
            kind, args = op[1], op[2]
            if kind == "create":
                path, ident = args
                self.dur_names[path] = ident
                self.dur_data[ident] = b""
            elif kind == "rename":
                src, dst = args
                self.dur_names[dst] = self.dur_names.pop(src)
            else:
                del self.dur_names[args[0]]
        self.pending = keep


def _path(d: str, name: str) -> str:
    return f"{d}/{name}" if d else name


def _run_random(disk, seed: int, steps: int) -> int:
    rng = random.Random(seed)
    m = disk.mount
    for d in DIRS[1:]:
        os.mkdir(m / d)
    fsync_path(m)
    model = DurableModel()
    checks = 0

    def fsync_dir(d):
        fsync_path(m / d if d else m)
        model.commit_dir(d)

    for step in range(steps):
        d = rng.choice(DIRS)
        name = rng.choice(NAMES)
        path = _path(d, name)
        roll = rng.random()
        if path not in model.vol_names:
            if roll < 0.5:
                os.close(os.open(m / path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                ident = model.next_id
                model.next_id += 1
                model.vol_names[path] = ident
                model.vol_data[ident] = bytearray()
                model.pending.append((d, "create", (path, ident)))
            elif roll < 0.6:
                fsync_dir(d)
            continue
        ident = model.vol_names[path]
        if roll < 0.35:
            off = rng.randrange(0, len(model.vol_data[ident]) + 64)
            data = rng.randbytes(rng.randrange(1, 200))
            with open(m / path, "r+b") as f:
                f.seek(off)
                f.write(data)
            buf = model.vol_data[ident]
            if len(buf) < off:
                buf.extend(b"\0" * (off - len(buf)))
            buf[off:off + len(data)] = data
        elif roll < 0.45:
            n = rng.randrange(0, len(model.vol_data[ident]) + 32)
            os.truncate(m / path, n)
            buf = model.vol_data[ident]
            del buf[n:]
            buf.extend(b"\0" * (n - len(buf)))
        elif roll < 0.6:
            if ident not in model.dur_names.values():
                fsync_dir(d)
            fsync_path(m / path)
            model.dur_data[ident] = bytes(model.vol_data[ident])
        elif roll < 0.7:
            dst = _path(d, rng.choice(NAMES))
            if dst != path:
                os.replace(m / path, m / dst)
                model.vol_names[dst] = model.vol_names.pop(path)
                model.pending.append((d, "rename", (path, dst)))
        elif roll < 0.78:
            os.unlink(m / path)
            del model.vol_names[path]
            model.pending.append((d, "unlink", (path,)))
        elif roll < 0.9:
            fsync_dir(d)
        elif roll < 0.95:
            assert read(m / path) == bytes(model.vol_data[ident]), f"step {step}: pending read of {path}"
            checks += 1
        else:
            disk.cut()
            model.cut()
            on_disk = {}
            for dd in DIRS:
                for entry in os.listdir(disk.backing / dd if dd else disk.backing):
                    if dd == "" and entry in DIRS:
                        continue
                    on_disk[_path(dd, entry)] = read(disk.backing / _path(dd, entry))
            want = {p: model.dur_data[i] for p, i in model.dur_names.items()}
            assert on_disk == want, f"seed {seed} step {step}: backing dir differs from the model"
            for p, i in model.dur_names.items():
                assert read(m / p) == model.dur_data[i]
            checks += 1
    return checks


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_random_operations_then_cut_match_the_durable_model(disk, seed):
    checks = _run_random(disk, seed, steps=400)
    assert checks > 10


def test_torn_cut_keeps_a_prefix_of_each_pending_write(tmp_path):
    with power_cut_disk(tmp_path, seed=3) as disk:
        _torn_cuts(disk)


def _torn_cuts(disk):
    m = disk.mount
    base = b"B" * 100
    tails = set()
    for _ in range(12):
        durable_file(disk, "seg", base)
        with open(m / "seg", "ab") as f:
            f.write(b"0123456789" * 50)
        write_file(m / "new", b"never durable", fsync=False)
        disk.cut(torn=True)
        got = read(m / "seg")
        assert got[:100] == base
        assert (b"0123456789" * 50).startswith(got[100:])
        assert not (m / "new").exists()
        tails.add(len(got) - 100)
    assert len(tails) > 1, "every torn cut kept the same part"
