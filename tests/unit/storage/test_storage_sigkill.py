"""A real process appending (idempotently) and flushing is SIGKILLed; the log it
leaves recovers to a prefix of what it wrote, with everything it reported flushed,
and a retry of its last batch is still recognised as a duplicate."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from semel.protocol.records import build_batch, iter_batches, iter_records, split_batches
from semel.storage import LogConfig, PartitionLog

pytestmark = pytest.mark.process   # the writer is a child process killed with SIGKILL

PID = 4242
CFG = LogConfig(segment_bytes=64 * 1024, index_interval_bytes=1024, checkpoint_interval_bytes=32 * 1024)

CHILD = textwrap.dedent(f"""
    import sys
    from pathlib import Path
    from semel.protocol.records import build_batch, split_batches
    from semel.storage import LogConfig, PartitionLog
    cfg = LogConfig(segment_bytes={CFG.segment_bytes}, index_interval_bytes={CFG.index_interval_bytes},
                    checkpoint_interval_bytes={CFG.checkpoint_interval_bytes})
    plog = PartitionLog.open(Path(sys.argv[1]), cfg)
    seq = 0
    while True:
        recs = [(None, b"%d" % (seq + i) + b"." * 300) for i in range(3)]
        data = build_batch(recs, producer_id={PID}, producer_epoch=0, base_sequence=seq)
        plog.append(data, split_batches(data)[0])
        seq += 3
        if seq % 30 == 0:
            print(plog.flush(), flush=True)
""")


@pytest.mark.parametrize("kill_after", [3, 40])
def test_sigkill_while_appending(tmp_path, kill_after):
    d = tmp_path / "t-0"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(d)], stdout=subprocess.PIPE, env=env, text=True)
    try:
        flushed = 0
        for _ in range(kill_after):
            line = child.stdout.readline()
            assert line, "child died early"
            flushed = int(line)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL

    plog = PartitionLog.open(d, CFG)
    got, offset = [], 0
    while offset < plog.log_end_offset:
        data = plog.read(offset, 1 << 20)
        for pos, hdr in iter_batches(data):
            got.extend(int(r.value.rstrip(b".")) for r in iter_records(data, pos))
            offset = hdr.next_offset
    assert got == list(range(len(got)))             # a prefix, nothing torn or doubled
    assert len(got) >= flushed                      # everything reported durable is there
    assert len(got) % 3 == 0                        # whole batches only
    # the producer retries its last batch after the restart: recognised, not written twice
    seq = len(got) - 3
    data = build_batch([(None, b"%d" % (seq + i) + b"." * 300) for i in range(3)],
                       producer_id=PID, producer_epoch=0, base_sequence=seq)
    again = plog.append(data, split_batches(data)[0])
    assert again.duplicate and again.first_offset == seq
    plog.close()
