"""A step of one broker's wall clock (an hour forward, then an hour back, through the
test-only clock seam semel.clock: SEMEL_CLOCK_STEP_FILE) while a transaction is open
and a consumer group member is live: the transaction neither times out early nor
stays open past its timeout, and no session expires. Durations run on the monotonic
clock; the wall clock only stamps."""
from __future__ import annotations

import os
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from semel.clock import STEP_FILE_ENV
from semel.launch.process import SemelBroker
from tests.support.wait import until

pytestmark = pytest.mark.process


def step(path, seconds: float) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(str(seconds))
    os.replace(tmp, path)
    time.sleep(0.3)       # the broker re-reads it within 50 ms


@pytest.fixture(scope="module")
def stepped(tmp_path_factory):
    d = tmp_path_factory.mktemp("clock")
    step_file = d / "step"
    step(step_file, 0)
    b = SemelBroker(d / "data", log_path=d / "broker.log", env={STEP_FILE_ENV: str(step_file)},
                    extra_args=["--transaction-abort-check-interval-ms", "100",
                                "--group-initial-rebalance-delay-ms", "0"])
    b.start()
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        for f in admin.create_topics([NewTopic(t, 1, 1) for t in ("clock-in", "clock-out")]).values():
            f.result(30)
        yield b, step_file
    finally:
        b.close()


def test_a_clock_step_neither_aborts_an_open_transaction_nor_expires_a_session(stepped):
    b, step_file = stepped
    revoked = []
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "clock", "session.timeout.ms": 6000,
                  "heartbeat.interval.ms": 500, "auto.offset.reset": "earliest"})
    c.subscribe(["clock-in"], on_revoke=lambda consumer, parts: revoked.append(len(parts)))
    plain = Producer({"bootstrap.servers": b.bootstrap})
    plain.produce("clock-in", b"x")
    assert plain.flush(30) == 0
    p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "clock-txn", "transaction.timeout.ms": 20000})
    until(lambda: c.poll(0.2) is not None or bool(c.assignment()), "the member assigned")
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("clock-in", b"in a transaction")
    assert p.flush(30) == 0
    try:
        for seconds in (3600, -3600, 0):
            step(step_file, seconds)
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                c.poll(0.1)
        p.commit_transaction(30)       # an early timeout abort would have fenced this producer
        assert revoked == [] and c.assignment(), "the member's session expired on a clock step"
    finally:
        c.close()
        step(step_file, 0)


def test_a_clock_stepped_back_does_not_keep_a_transaction_open_past_its_timeout(stepped):
    b, step_file = stepped
    p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "clock-late", "transaction.timeout.ms": 3000})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("clock-out", b"left open")
    assert p.flush(30) == 0
    step(step_file, -3600)
    try:
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "clock-reader",
                      "isolation.level": "read_committed", "enable.auto.commit": False})
        tp = TopicPartition("clock-out", 0)
        assert c.get_watermark_offsets(tp, 5, cached=False)[1] == 0      # held at the open transaction
        # A read_committed consumer's high offset is the last stable offset: the timeout
        # abort (3 s, checked every 100 ms) moves it past the record and its ABORT
        # marker; on the wall clock, an hour back, it would wait an hour.
        until(lambda: c.get_watermark_offsets(tp, 5, cached=False)[1] >= 2, "the timed-out transaction aborted", 30)
        c.close()
    finally:
        step(step_file, 0)
