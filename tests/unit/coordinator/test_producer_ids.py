"""ProducerIdManager: block reservations through the storage FileSystem, so disk
faults refuse a reservation and a damaged file stops the start with a clear error."""
from __future__ import annotations

import pytest

from semel.coordinator.producer_ids import BLOCK_SIZE, ProducerIdManager
from semel.storage.errors import StorageError
from semel.storage.fs import FaultyFileSystem


def _take_block(pids: ProducerIdManager) -> list[int]:
    return [pids.next_id() for _ in range(BLOCK_SIZE)]


@pytest.mark.parametrize("arm", [
    lambda fs: fs.fail_next_write(path_contains="producer_ids"),
    lambda fs: fs.fail_next_fsync(path_contains="producer_ids"),
    lambda fs: fs.fail_next_rename(path_contains="producer_ids"),
    lambda fs: fs.fail_next_fsync(path_contains="data", skip=1),   # the directory's, after the file's
], ids=["write", "fsync", "rename", "fsync-dir"])
def test_a_disk_fault_refuses_the_reservation_and_no_id_is_reused(tmp_path, arm):
    path = tmp_path / "data" / "producer_ids"
    path.parent.mkdir()
    fs = FaultyFileSystem()
    first = ProducerIdManager(path, fs)
    handed = _take_block(first)
    arm(fs)
    with pytest.raises(StorageError, match="cannot reserve producer ids"):
        first.next_id()
    fs.clear_faults()
    handed.append(first.next_id())          # the fault passed: the reservation is retried
    # A restart starts past every id that could have been handed out.
    after = ProducerIdManager(path, fs)
    assert after.next_id() > max(handed)
    assert after.coordinator_epoch == first.coordinator_epoch + 1


def test_reservations_go_through_the_filesystem_given(tmp_path):
    fs = FaultyFileSystem()
    ProducerIdManager(tmp_path / "producer_ids", fs)
    assert fs.count("rename", "producer_ids") == 1 and fs.count("pwrite", "producer_ids") == 1


@pytest.mark.parametrize("keep", [0, 5, 15])
def test_a_truncated_file_is_a_clear_error(tmp_path, keep):
    path = tmp_path / "producer_ids"
    ProducerIdManager(path)
    path.write_bytes(path.read_bytes()[:keep])
    with pytest.raises(StorageError, match=rf"producer_ids is corrupt \({keep} bytes"):
        ProducerIdManager(path)


def test_a_damaged_file_is_a_clear_error(tmp_path):
    path = tmp_path / "producer_ids"
    ProducerIdManager(path)
    raw = bytearray(path.read_bytes())
    raw[3] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(StorageError, match="corrupt .checksum mismatch"):
        ProducerIdManager(path)
