"""Fixtures shared by the storage tests. A module picks its log settings by
defining `CFG`; `p` is a PartitionLog on a fault-injecting file system `fs`."""
from __future__ import annotations

import pytest

from semel.storage import FaultyFileSystem, PartitionLog


@pytest.fixture
def fs():
    return FaultyFileSystem()


@pytest.fixture
def p(request, tmp_path, fs):
    plog = PartitionLog.open(tmp_path / "t-0", request.module.CFG, fs)
    yield plog
    if not plog.closed:
        fs.clear_faults()
        plog.close()
