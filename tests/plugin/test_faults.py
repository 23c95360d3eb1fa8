"""Faults that need the machine's help, used as an outside project would: a power cut
of the broker's disk (FUSE) and a network partition (namespaces, root); where one
cannot be had the project's test is skipped with the reason, which here fails
unless outside CI."""
from __future__ import annotations

import os

import pytest

from semel.launch.lazyfs import fuse_unavailable_reason
from semel.launch.netns import available


def needs(reason: str | None) -> None:
    if reason and not os.environ.get("CI"):
        pytest.skip(reason)


def test_power_cut(project):
    needs(fuse_unavailable_reason())
    out = project({"test_faults.py": "faults.py"}, "-k", "power_cut")
    assert out.results == {"test_power_cut_keeps_what_was_acknowledged": "passed",
                           "test_power_cut_loses_what_was_never_fsynced": "passed"}, out.output[-4000:]


def test_partition(project):
    needs(available())
    out = project({"test_faults.py": "faults.py"}, "-k", "partition")
    assert out.results == {"test_partition_then_heal": "passed"}, out.output[-4000:]


def test_skip_reason_where_a_fault_cannot_be_had(project):
    """Without FUSE tools on the PATH the power-cut test is skipped, saying why."""
    out = project({"test_faults.py": "faults.py"}, "-k", "keeps_what", "-rs", env={"PATH": "/nonexistent"})
    assert out.results == {"test_power_cut_keeps_what_was_acknowledged": "skipped"}, out.output[-4000:]
    assert "power cuts need FUSE: fusermount3 is not installed" in out.output
