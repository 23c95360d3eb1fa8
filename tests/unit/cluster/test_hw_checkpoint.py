"""The high-watermark checkpoint (semel.cluster.hw_checkpoint): what it saves reads
back, and a damaged or missing file reads as no head start, never as wrong numbers."""
from __future__ import annotations

import pytest

from semel.cluster.hw_checkpoint import HW_FILE, decode_hws, encode_hws, load_hws, save_hws
from semel.storage import FaultyFileSystem

HWS = {("a", 0): 12, ("b.c_d-e", 3): 0}


def test_high_watermark_checkpoint_round_trips_and_a_damaged_one_is_empty():
    data = encode_hws(HWS)
    assert decode_hws(data) == HWS
    assert decode_hws(data[:-2]) == {}
    assert decode_hws(b"semel-epochs 1 00000000\n") == {}


def test_saved_through_the_file_system_seam(tmp_path):
    fs, path = FaultyFileSystem(), tmp_path / HW_FILE
    assert load_hws(fs, path) == {}
    save_hws(fs, path, HWS)
    assert load_hws(fs, path) == HWS
    fs.fail_next_rename(path_contains=HW_FILE)
    with pytest.raises(OSError):
        save_hws(fs, path, {("a", 0): 13})
    assert load_hws(fs, path) == HWS     # a failed save leaves the last one
