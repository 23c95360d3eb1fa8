"""Seeded random interleavings of transactions and operator actions against a real
broker, checked against a model after every step.

The admin abort (WriteTxnMarkers) decides from coordinator and partition state
and then writes: it must never write into a transaction the coordinator still
owns (that could contradict a commit decision), and `find_hanging` must never
call a live transaction hanging. Steps: begin/produce, commit, abort (EndTxn),
admin abort attempts on any producer and partition, find-hanging. Invariants
after each step: every partition's LSO is the first offset of its earliest open
transaction in the model (else the high watermark), an admin abort wrote nothing
and answered what the model predicts, the coordinator's state per id is the
model's, and nothing is reported hanging. At the end a read_committed
confluent-kafka consumer reads exactly the committed values."""
from __future__ import annotations

import random

import pytest
from support.brokers import module_broker
from support.consume import read_values
from support.txn import RawTxn

from semel.cli.route import Route
from semel.cli.txn import find_hanging
from semel.client import Client
from semel.client import admin
from semel.protocol.errors import KafkaError

PARTITIONS = 2
IDS = 3
STEPS = 60


@pytest.fixture(scope="module")
def model_broker(tmp_path_factory):
    with module_broker(tmp_path_factory, "ops-abort-model") as b:
        yield b


class Model:
    def __init__(self, c: Client, topic: str, rng: random.Random):
        self.c, self.topic, self.rng = c, topic, rng
        self.txns = [RawTxn(c, f"{topic}-tx{i}", timeout_ms=600_000) for i in range(IDS)]
        for t in self.txns:
            assert t.init() == KafkaError.NONE
        self.open: dict[int, dict[int, int]] = {}     # txn index -> {partition: first offset}
        self.pending: dict[int, list[str]] = {}      # txn index -> values of its open transaction
        self.committed: list[str] = []
        self.n = 0

    # --- steps ---------------------------------------------------------------------------
    def produce(self, i: int) -> None:
        t, p = self.txns[i], self.rng.randrange(PARTITIONS)
        assert t.add((self.topic, p)) == {(self.topic, p): KafkaError.NONE}
        self.n += 1
        value = f"v{self.n}"
        err, base = t.produce(self.topic, p, value.encode())
        assert err == KafkaError.NONE
        self.open.setdefault(i, {}).setdefault(p, base)
        self.pending.setdefault(i, []).append(value)

    def end(self, i: int, commit: bool) -> None:
        assert self.txns[i].end(commit) == KafkaError.NONE
        values = self.pending.pop(i, [])
        self.open.pop(i, None)
        if commit:
            self.committed += values

    def admin_abort(self, i: int, p: int) -> None:
        t = self.txns[i]
        tp = (self.topic, p)
        hw = self.c.list_offset(*tp, -1)
        rows = admin.describe_producers(self.c, [tp])[tp]
        row = next((r for r in rows if r.producer_id == t.pid), None)
        epoch, coord_epoch = (row.producer_epoch, row.coordinator_epoch) if row else (t.epoch, -1)
        err = admin.abort_partition(self.c, self.topic, p, t.pid, epoch, coord_epoch)
        owned = p in self.open.get(i, {})
        expected = KafkaError.CONCURRENT_TRANSACTIONS if owned else KafkaError.NONE
        assert err == expected, (i, p, err)
        assert self.c.list_offset(*tp, -1) == hw, "an admin abort wrote into the log"

    # --- invariants ----------------------------------------------------------------------
    def check(self) -> None:
        for p in range(PARTITIONS):
            firsts = [parts[p] for parts in self.open.values() if p in parts]
            hw = self.c.list_offset(self.topic, p, -1)
            lso = self.c.list_offset(self.topic, p, -1, isolation=1)
            assert lso == (min(firsts) if firsts else hw), (p, lso, firsts, hw)
        described = admin.describe_transactions(self.c, [t.txn_id for t in self.txns])
        for i, d in enumerate(described):
            assert (d.state == "Ongoing") == (i in self.open), (i, d.state)
        route = Route(Client, self.c)
        try:
            assert find_hanging(route, [self.topic]) == []
        finally:
            route.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_interleavings_keep_admin_abort_safe(model_broker, seed):
    rng = random.Random(seed)
    topic = f"model-{seed}"
    with Client(model_broker.bootstrap) as c:
        assert c.create_topic(topic, PARTITIONS) == KafkaError.NONE
        m = Model(c, topic, rng)
        for _ in range(STEPS):
            i = rng.randrange(IDS)
            roll = rng.random()
            if roll < 0.4:
                m.produce(i)
            elif roll < 0.6 and i in m.open:
                m.end(i, commit=True)
            elif roll < 0.7 and i in m.open:
                m.end(i, commit=False)
            else:
                m.admin_abort(i, rng.randrange(PARTITIONS))
            m.check()
        for i in list(m.open):
            m.end(i, commit=rng.random() < 0.5)
        m.check()
    assert sorted(read_values(model_broker.bootstrap, topic, PARTITIONS, want=len(m.committed))) == \
        sorted(m.committed)
