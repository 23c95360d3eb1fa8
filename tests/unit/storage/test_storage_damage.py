"""Bytes damaged on disk after a clean close (below the recovery checkpoint, so start
does not look at them) are caught when read back: read_checked serves the intact
batches before the damage and raises CorruptLogError naming the segment file when
the damaged batch comes first. Random damage anywhere, never a wrong batch."""
from __future__ import annotations

import random

import pytest

from semel.protocol.records import crc_ok, iter_batches
from semel.storage import LogConfig, PartitionLog
from semel.storage.errors import CorruptLogError
from semel.storage.segment import LOG_SUFFIX, segment_name

from storage_helpers import fill

CFG = LogConfig(segment_bytes=1 << 20, index_interval_bytes=128)


def _read_all_checked(plog: PartitionLog) -> tuple[list[int], CorruptLogError | None]:
    offsets, offset = [], 0
    while offset < plog.log_end_offset:
        try:
            data = plog.read_checked(offset, 4096)
        except CorruptLogError as exc:
            return offsets, exc
        for pos, hdr in iter_batches(data):
            assert crc_ok(data, pos, hdr.size) and hdr.base_offset == offset
            offsets.append(offset)
            offset = hdr.last_offset + 1
    return offsets, None


@pytest.mark.parametrize("seed", range(12))
def test_random_damage_below_a_clean_checkpoint_is_never_served(tmp_path, fs, seed):
    rng = random.Random(seed)
    plog = PartitionLog.open(tmp_path / "t-0", CFG, fs)
    fill(plog, 80)
    plog.close()
    path = tmp_path / "t-0" / f"{segment_name(0)}{LOG_SUFFIX}"
    data = bytearray(path.read_bytes())
    at = rng.randrange(len(data) - 8)
    for i in range(rng.randint(1, 8)):
        data[at + i] ^= rng.randrange(1, 256)
    path.write_bytes(bytes(data))
    plog = PartitionLog.open(tmp_path / "t-0", CFG, fs)
    try:
        assert plog.recovery.clean            # start trusted the file: only reads can notice
        offsets, err = _read_all_checked(plog)
        assert offsets == list(range(len(offsets)))
        assert err is not None and str(path) in str(err) and err.offset == len(offsets)
        assert len(offsets) < 80
    finally:
        plog.close()
