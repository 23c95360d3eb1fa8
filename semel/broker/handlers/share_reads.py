"""What a share group may deliver from a partition log: where the fetchable range ends
(the high watermark, or the last stable offset under read_committed) and which offsets
in it hold nothing to deliver (transaction markers; under read_committed, the records
of aborted transactions). Records of a transaction still open lie past the last stable
offset, so read_committed never reaches them."""
from __future__ import annotations

from ...protocol import records as rb
from ...storage.log import PartitionLog

# How much log one acquisition looks at: enough for MaxRecords of ordinary records.
SCAN_BYTES = 1 << 20


def fetchable(plog: PartitionLog, offset: int, read_committed: bool) -> tuple[int, set[int], set[int]]:
    """(end of what may be acquired from `offset` on, offsets to skip in that range, the
    first offsets of its batches)."""
    bound = plog.last_stable_offset if read_committed else plog.high_watermark
    starts: set[int] = set()
    if offset >= bound:
        return bound, set(), starts
    data = plog.read(offset, SCAN_BYTES, bound)
    aborted_first: dict[int, list[int]] = {}
    if read_committed:
        for pid, first in plog.aborted_transactions(offset, bound):
            aborted_first.setdefault(pid, []).append(first)
    aborting: set[int] = set()   # producers whose open batches are of an aborted transaction
    skip: set[int] = set()
    end = offset
    for pos, hdr in rb.iter_batches(data):
        if hdr.next_offset > bound:
            break
        pid = hdr.producer_id
        starts.add(hdr.base_offset)
        if hdr.is_control:
            skip.update(range(hdr.base_offset, hdr.next_offset))
            if rb.control_type(data, pos) == rb.CONTROL_ABORT:
                aborting.discard(pid)
        elif read_committed and hdr.is_transactional:
            if any(f <= hdr.last_offset for f in aborted_first.get(pid, ())):
                aborted_first[pid] = [f for f in aborted_first[pid] if f > hdr.last_offset]
                aborting.add(pid)
            if pid in aborting:
                skip.update(range(hdr.base_offset, hdr.next_offset))
        end = hdr.next_offset
    if end == offset and data:   # a batch larger than the scan: take it whole next time
        return offset, skip, starts
    return (min(end, bound) if data else offset), skip, starts


def read_range(plog: PartitionLog, first: int, last: int) -> bytes:
    """The whole batches that hold offsets `first`..`last` (the client keeps only the
    offsets it acquired)."""
    out = bytearray()
    offset = first
    bound = plog.high_watermark   # the batch holding `last` may end past it: read it whole
    while offset <= last:
        data = plog.read(offset, SCAN_BYTES, bound)
        if not data:
            break
        for pos, hdr in rb.iter_batches(data):
            if hdr.base_offset > last:
                return bytes(out)
            out += bytes(data[pos:pos + hdr.size])
            offset = hdr.next_offset
    return bytes(out)
