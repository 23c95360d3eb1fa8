"""The sink's columnar write path (_feed_arrow) against its row path: for any Arrow input,
the same records go to the same partitions in the same order, cut into the same record
batches (rows per batch, the 1 MB cap, a flush after each Arrow batch) at the same
sequence numbers. No broker: the producer records its sends."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

from semel.client import txn as wire
from semel.protocol import records
from semel.protocol.errors import KafkaError
from semel.spark import sink
from semel.spark import branch_writer
from semel.spark import sink_options


class Recorder(branch_writer._BranchProducer):
    """Answers every request with success and keeps each partition's record batches,
    decoded: the row path's come from aiokafka's builder, the columnar path's from
    semel.spark.batches, so this also checks that the two encode the same records."""

    def __init__(self, o: sink_options.SinkOptions):
        super().__init__(o, None, wire.TxnState("t", 7, 0))
        self.sent: list[tuple[tuple[str, int], list]] = []

    def _round(self, data, new, tail):
        for tp, batch in data.items():
            assert records.parse_header(batch).base_sequence == self.st.seq.get(tp, 0)
            self.sent.append((tp, [(r.key, r.value) for r in records.iter_records(batch)]))
        return {tp: KafkaError.NONE for tp in new}, {tp: KafkaError.NONE for tp in data}, None


def random_batches(rng: random.Random, key_type, value_type, nulls: bool) -> list:
    out = []
    for _ in range(rng.randint(1, 6)):
        n = rng.choice([0, 1, 5, 40, 300])
        keys = [None if nulls and rng.random() < 0.1 else f"k{rng.randint(0, 30)}" for _ in range(n)]
        values = [None if rng.random() < 0.05 else "v" * rng.choice([0, 3, 200, 300_000]) for _ in range(n)]
        conv = (lambda x: x) if value_type == pa.string() else (lambda x: None if x is None else x.encode())
        kconv = (lambda x: x) if key_type == pa.string() else (lambda x: None if x is None else x.encode())
        out.append(pa.record_batch([pa.array([kconv(k) for k in keys], key_type),
                                    pa.array([conv(v) for v in values], value_type)], names=["key", "value"]))
    return out


def run(o: sink_options.SinkOptions, cols: dict, rows, start: int) -> list:
    producer = Recorder(o)
    part = branch_writer.Partitioner(None, start)
    part.sizes["out"] = 3
    branch_writer._feed(producer, part, cols, rows, "out")
    producer.flush()
    # per partition, the requests in order (the order across partitions is free: each
    # partition's records and sequence numbers are independent of the others')
    requests: dict = {}
    for tp, rows in producer.sent:
        requests.setdefault(tp, []).append(rows)
    return requests


@pytest.mark.parametrize("seed", range(40))
def test_columnar_path_sends_what_the_row_path_sends(seed):
    rng = random.Random(seed)
    o = sink.parse_options({"kafka.bootstrap.servers": "127.0.0.1:1", "semel.query.id": "q", "topic": "out",
                            "semel.batch.rows": str(rng.choice([1, 7, 100_000]))})
    batches = random_batches(rng, rng.choice([pa.string(), pa.binary()]), rng.choice([pa.string(), pa.binary()]),
                             nulls=rng.random() < 0.3)
    with_key = rng.random() < 0.7
    if not with_key:
        batches = [pa.record_batch([b.column(1)], names=["value"]) for b in batches]
    cols = {"key": 0, "value": 1} if with_key else {"value": 0}
    start = rng.randint(0, 5)
    by_rows = run(o, cols, branch_writer.ArrowInput(iter(batches), columnar=False), start)
    by_columns = run(o, cols, branch_writer.ArrowInput(iter(batches)), start)
    assert by_columns == by_rows
    assert sum(len(rows) for reqs in by_rows.values() for rows in reqs) == sum(b.num_rows for b in batches)
