"""glibc malloc settings for the broker process.

With glibc's defaults a broker under load spends a large share of its CPU in
page faults: its big, short-lived buffers (socket reads of up to 1 MiB, request
frames, record batches, TLS records) sit above the mmap threshold or are
trimmed back to the kernel when freed, so every request maps fresh pages, the
kernel zeroes them (clear_page) and unmaps them again. Measured on the 2-core
box with perf: a 200 MiB upload read through the broker's stream path cost
0.39-0.47 s of CPU with the defaults and 0.10-0.12 s with allocations up to
4 MiB kept in the heap and free memory trimmed only above 32 MiB (page faults
and clear_page were a quarter of the samples before). The cost is memory: up
to trim_threshold of freed heap stays with the process.

The threshold must sit above the largest buffer the broker makes routinely. A
fixed threshold turns off glibc's dynamic one (which rises to the size of any
mapped chunk freed, up to 32 MiB), so a buffer just above it is mapped and
faulted in on every use. At 4 MiB that hit every full Fetch: one pread of
max_fetch_response_bytes (4 MiB) plus the index walk (64 KiB) per response,
1,041 page faults each, 0.75 s of CPU per GB served more than glibc's defaults
(measured here: the 4x8 100 B consume benchmark paid it in full). Hence 32
MiB, glibc's own ceiling, and trimming above 64 MiB; a test keeps the Fetch
read below it.

An operator's MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ (glibc's own
environment settings) win over these; SEMEL_MALLOC_TUNING=off leaves glibc's
defaults (for A/B measurements); on a libc without mallopt nothing changes.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from typing import Callable

log = logging.getLogger("semel.broker")

# glibc <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024
OPERATOR_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
SWITCH = "SEMEL_MALLOC_TUNING"    # "off": leave glibc's defaults


def tune_allocator(mmap_threshold: int = MMAP_THRESHOLD_BYTES, trim_threshold: int = TRIM_THRESHOLD_BYTES) -> bool:
    """Applies the thresholds; False when left alone (operator settings, switched off, no glibc)."""
    if any(name in os.environ for name in OPERATOR_SETTINGS) or os.environ.get(SWITCH, "").lower() == "off":
        return False
    mallopt = _mallopt()
    if mallopt is None:
        return False
    # mallopt returns 1 on success, 0 on error
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))


def _mallopt() -> Callable[[int, int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):   # no libc found, or one without mallopt (musl)
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn
