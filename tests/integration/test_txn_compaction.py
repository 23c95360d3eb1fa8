"""The transaction coordinator's log stays bounded: once it holds many more
records than live transactional ids, the live state is rewritten and old
segments are dropped — and a SIGKILLed broker restarts into the same state."""
from __future__ import annotations

import time

from semel.client import Client
from semel.protocol.errors import KafkaError as E
from tests.support.txn import RawTxn

TOPIC = "__transaction_state"


def segment_files(broker) -> list[str]:
    return sorted(p.name for p in (broker.data_dir / f"{TOPIC}-0").glob("*.log"))


def test_transaction_log_is_compacted_and_survives_sigkill(start_broker):
    b = start_broker("--transaction-log-compact-records", "300", "--transaction-log-segment-bytes", "4096",
                     "--transaction-abort-check-interval-ms", "100")
    with Client(b.bootstrap) as c:
        assert c.create_topic("data", 1) == E.NONE
        producers = {name: RawTxn(c, name) for name in ("a", "b", "c")}
        for _ in range(150):                       # 450 epoch bumps: 450 coordinator records
            for p in producers.values():
                assert p.init() == E.NONE
        open_txn = RawTxn(c, "open")
        assert open_txn.init() == E.NONE
        assert open_txn.add(("data", 0)) == {("data", 0): E.NONE}
        assert open_txn.produce("data", 0, b"pending")[0] == E.NONE
        deadline = time.monotonic() + 20
        while c.list_offset(TOPIC, 0, -2) == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        start = c.list_offset(TOPIC, 0, -2)
        end = c.list_offset(TOPIC, 0, -1)
    assert start > 0, "no old segment was dropped"
    assert end - start < 450, (start, end)
    before = {n: (p.pid, p.epoch) for n, p in producers.items()}

    b.kill()
    b.restart()
    with Client(b.bootstrap) as c:
        assert c.list_offset("data", 0, -1, isolation=1) == 0        # the open transaction still holds the LSO
        for name, (pid, epoch) in before.items():
            p = RawTxn(c, name)
            assert p.init() == E.NONE
            assert (p.pid, p.epoch) == (pid, epoch + 1), name       # state continued, not reset
        fresh = RawTxn(c, "open")
        assert fresh.init() == E.NONE                               # fences and aborts the open one
        assert fresh.epoch == open_txn.epoch + 2
        assert c.list_offset("data", 0, -1, isolation=1) == c.list_offset("data", 0, -1)
    assert len(segment_files(b)) < 20
