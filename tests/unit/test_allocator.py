"""semel.broker.allocator: on glibc the broker's large buffers stay in the heap instead
of being mapped and faulted in again for every request, and an operator's own
MALLOC_*_ settings win. Each case runs in a fresh interpreter (mallopt changes the
whole process)."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.process   # each probe runs in a fresh Python process

# Prints whether the thresholds were applied, then the minor page faults of the
# broker's read path in miniature: 256 KiB socket reads appended to a stream buffer,
# taken out 768 KiB at a time as one bytes object.
PROBE = """
import resource, sys
from semel.broker.allocator import tune_allocator
print(tune_allocator() if sys.argv[1] == "tune" else None)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
src = b"x" * (256 * 1024)
before = faults()
buf = bytearray()
for i in range(400):
    buf.extend(src[: len(src) - i])
    if len(buf) >= 3 * len(src):
        data = bytes(memoryview(buf)[: 3 * len(src)])
        del buf[: 3 * len(src)]
        del data
print(faults() - before)
"""


def _probe(mode: str, **env) -> tuple[str, int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    r = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                       env={**clean, **env}, timeout=60)
    assert r.returncode == 0, r.stderr
    applied, faults = r.stdout.split()
    return applied, int(faults)


def test_large_buffers_stay_in_the_heap_on_glibc():
    assert platform.libc_ver()[0] == "glibc", "the test box runs glibc"
    applied, tuned = _probe("tune")
    assert applied == "True"
    _, default = _probe("leave")
    assert default > 10_000, default   # ~130 reads, each mapping and faulting in ~190 pages
    assert tuned < default / 10, (tuned, default)


@pytest.mark.parametrize("name", ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"])
def test_an_operators_setting_wins(name):
    assert _probe("tune", **{name: "131072"})[0] == "False"


def test_switched_off_leaves_glibcs_defaults():
    """SEMEL_MALLOC_TUNING=off (the benchmarks' A/B switch): not applied, and the read
    path faults pages in as with the defaults."""
    applied, faults = _probe("tune", SEMEL_MALLOC_TUNING="off")
    assert applied == "False"
    assert faults > 10_000, faults


# A full Fetch in miniature: one pread of the response cap plus the index walk, viewed,
# then dropped; repeated. Prints the minor page faults.
FETCH_PROBE = """
import os, resource, sys, tempfile
from semel.broker.allocator import tune_allocator
from semel.broker.config import BrokerConfig
from semel.storage.segment import _SCAN_CHUNK
print(tune_allocator())
size = BrokerConfig(data_dir=".").max_fetch_response_bytes + _SCAN_CHUNK
with tempfile.TemporaryFile() as f:
    f.write(os.urandom(size))
    f.flush()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(100):
        view = memoryview(os.pread(f.fileno(), size, 0))[10:-10]
        del view
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_a_full_fetch_read_is_not_faulted_in_each_time():
    """The threshold sits above the biggest routine buffer, a Fetch response's pread:
    a fixed threshold just below it (4 MiB once) mapped and faulted ~1,000 pages per
    response, slower than glibc's defaults."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    r = subprocess.run([sys.executable, "-c", FETCH_PROBE], capture_output=True, text=True, env=clean, timeout=60)
    assert r.returncode == 0, r.stderr
    applied, faults = r.stdout.split()
    assert applied == "True"
    assert int(faults) < 100 * 100, faults     # per read it would be ~1,000 each
