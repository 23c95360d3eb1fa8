"""The checksummed small-file helper: both on-disk layouts read back byte for byte as
brokers have written them, a torn or damaged file is refused (None, or a DamagedFile
naming it), and a write that fails on the FileSystem seam leaves the old content."""
from __future__ import annotations

import errno
import struct

import crc32c
import pytest

from semel.storage import FaultyFileSystem, checked_file
from semel.storage.checked_file import DamagedFile
from semel.storage.errors import StorageError

HEADER = "semel-test 1 "
BODY = b"1 0\n7 120\n"


def test_the_text_layout_is_the_one_on_disk():
    data = checked_file.encode(HEADER, BODY)
    assert data == f"semel-test 1 {crc32c.crc32c(BODY):08x}\n".encode() + BODY
    assert checked_file.decode(HEADER, data) == BODY


def test_the_binary_layout_is_the_one_on_disk():
    data = checked_file.seal(BODY)
    assert data == BODY + struct.pack(">I", crc32c.crc32c(BODY))
    assert bytes(checked_file.unseal(data)) == BODY
    assert bytes(checked_file.unseal(data, len(data))) == BODY
    assert checked_file.unseal(data, len(data) + 1) is None


@pytest.mark.parametrize("layout", ["text", "binary"])
def test_every_torn_or_flipped_file_is_refused(layout):
    if layout == "text":
        data, opener = checked_file.encode(HEADER, BODY), lambda d: checked_file.decode(HEADER, d)
    else:
        data, opener = checked_file.seal(BODY), checked_file.unseal
    for cut in range(len(data)):
        assert opener(data[:cut]) is None, cut
    for i in range(len(data)):
        flipped = bytearray(data)
        flipped[i] ^= 0x01
        assert opener(bytes(flipped)) is None, i


def test_a_foreign_header_is_refused():
    assert checked_file.decode("semel-other 1 ", checked_file.encode(HEADER, BODY)) is None


def test_read_names_a_damaged_file(tmp_path):
    fs = FaultyFileSystem()
    path = tmp_path / "f"
    assert checked_file.read(fs, path, checked_file.unseal, "test record") is None   # no file yet
    checked_file.write(fs, path, checked_file.seal(BODY))
    assert bytes(checked_file.read(fs, path, checked_file.unseal, "test record")) == BODY
    path.write_bytes(path.read_bytes()[:-1])   # torn
    with pytest.raises(DamagedFile, match=r"torn or damaged test record \(13 bytes; checksum mismatch\)") as info:
        checked_file.read(fs, path, checked_file.unseal, "test record")
    assert isinstance(info.value, StorageError) and str(path) in str(info.value)


@pytest.mark.parametrize("fault", ["write", "torn-write", "fsync", "rename"])
def test_a_failed_write_leaves_the_old_file(tmp_path, fault):
    fs = FaultyFileSystem()
    path = tmp_path / "f"
    checked_file.write(fs, path, checked_file.encode(HEADER, b"old\n"))
    if fault == "write":
        fs.fail_next_write(path_contains="f.tmp")
    elif fault == "torn-write":
        fs.fail_next_write(path_contains="f.tmp", partial=True)
    elif fault == "fsync":
        fs.fail_next_fsync(path_contains="f.tmp")
    else:
        fs.fail_next_rename(path_contains="f.tmp")
    with pytest.raises(OSError) as info:
        checked_file.write(fs, path, checked_file.encode(HEADER, b"new\n"))
    assert info.value.errno == errno.EIO
    assert checked_file.read(fs, path, lambda d: checked_file.decode(HEADER, d), "test file") == b"old\n"
    assert not (tmp_path / "f.tmp").exists()
