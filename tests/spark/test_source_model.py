"""The source's range reads under random interleavings of transactions (seeded).

Three transactional producers and a plain one write to a real semel broker in a
random order: records, commits and aborts interleave, transactions stay open
across steps. After every step the reader client (what the Spark executors
run) is checked against a model of the log:
- the end it plans under read_committed is the LSO (first offset of the oldest
  open transaction, else the log end), under read_uncommitted the high watermark;
- reading [0, LSO), and a random sub-range, returns exactly the plain and
  committed records there, in offset order, never an aborted, open or control one;
- every range read before is read again with identical rows (re-read identity),
  also when small fetches cut it in the middle of transactions.
"""
from __future__ import annotations

import random

import pytest

from semel.client import Client
from semel.client.cluster import ClusterRouter
from semel.client.reader import read_range
from semel.protocol import records
from tests.support import wait
from tests.support.txn import RawTxn

TOPIC, PARTITIONS = "model", 2


class Model:
    def __init__(self):
        # per partition: offset -> ("plain"|"txn"|"marker", value, producer)
        self.log: list[dict[int, tuple]] = [{} for _ in range(PARTITIONS)]
        self.end = [0] * PARTITIONS
        self.open: dict[str, dict[int, int]] = {}        # producer -> partition -> first offset
        self.aborted: set[tuple[str, int]] = set()        # (producer, txn number)
        self.txn_no: dict[str, int] = {}

    def lso(self, p: int) -> int:
        firsts = [parts[p] for parts in self.open.values() if p in parts]
        return min(firsts) if firsts else self.end[p]

    def visible(self, p: int, lo: int, hi: int) -> list[tuple[int, bytes]]:
        out = []
        for off in range(lo, hi):
            kind, value, who = self.log[p][off]
            if kind == "plain" or (kind == "txn" and who not in self.aborted):
                out.append((off, value))
        return out


def rows_of(cluster: ClusterRouter, topic: str, p: int, lo: int, hi: int,
            max_bytes: int) -> list[tuple[int, bytes]]:
    return [(o, v) for rows in read_range(cluster, (topic, p), lo, hi, read_committed=True,
                                          include_headers=False, max_bytes=max_bytes)
            for o, v in zip(rows.offsets, rows.values)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_range_reads_match_the_model_after_every_step(spark_broker, seed):
    broker = spark_broker
    rnd = random.Random(seed)
    topic_admin = Client(broker.bootstrap)
    topic = f"{TOPIC}-{seed}"   # one topic per seed: the model's offsets start at 0
    assert topic_admin.create_topic(topic, PARTITIONS) == 0

    model = Model()
    producers = {}
    for name in ("t1", "t2", "t3"):
        raw = RawTxn(Client(broker.bootstrap), f"model-{seed}-{name}")
        assert raw.init() == 0
        producers[name] = raw
    plain = Client(broker.bootstrap)
    cluster = ClusterRouter(broker.bootstrap, timeout_s=30)
    reads: list[tuple[int, int, int, list]] = []   # (partition, lo, hi, rows)
    n = 0

    def write_txn(name: str) -> None:
        nonlocal n
        raw, p = producers[name], rnd.randrange(PARTITIONS)
        parts = model.open.setdefault(name, {})
        if not parts:
            model.txn_no[name] = model.txn_no.get(name, 0) + 1
        if p not in parts:
            assert raw.add((topic, p))[(topic, p)] == 0
        values = [f"{name}-{n + i}".encode() for i in range(rnd.randint(1, 4))]
        n += len(values)
        err, base = raw.produce(topic, p, *values)
        assert err == 0 and base == model.end[p]
        parts.setdefault(p, base)
        for i, v in enumerate(values):
            model.log[p][base + i] = ("txn", v, (name, model.txn_no[name]))
        model.end[p] = base + len(values)

    def end_txn(name: str, commit: bool) -> None:
        parts = model.open.pop(name)
        if not commit:
            model.aborted.add((name, model.txn_no[name]))
        assert producers[name].end(commit) == 0
        for p in parts:
            model.log[p][model.end[p]] = ("marker", None, None)
            model.end[p] += 1
        wait.until(lambda: all(cluster.latest([(topic, p)], False)[(topic, p)] == model.end[p]
                               for p in parts), "markers written")

    def write_plain() -> None:
        nonlocal n
        p = rnd.randrange(PARTITIONS)
        values = [f"plain-{n + i}".encode() for i in range(rnd.randint(1, 3))]
        n += len(values)
        batch = records.build_batch([(None, v) for v in values])
        err, base = plain.produce(topic, p, batch)
        assert err == 0 and base == model.end[p]
        for i, v in enumerate(values):
            model.log[p][base + i] = ("plain", v, None)
        model.end[p] = base + len(values)

    try:
        for step in range(40):
            name = rnd.choice(list(producers))
            action = rnd.random()
            if name in model.open and action < 0.35:
                end_txn(name, commit=rnd.random() < 0.6)
            elif action < 0.8:
                write_txn(name)
            else:
                write_plain()

            tps = [(topic, p) for p in range(PARTITIONS)]
            lso = cluster.latest(tps, True)
            hw = cluster.latest(tps, False)
            for p in range(PARTITIONS):
                where = f"seed {seed} step {step} partition {p}"
                assert lso[(topic, p)] == model.lso(p), where
                assert hw[(topic, p)] == model.end[p], where
                end = model.lso(p)
                max_bytes = rnd.choice([80, 200, 1 << 20])   # small: fetches end inside transactions
                assert rows_of(cluster, topic, p, 0, end, max_bytes) == model.visible(p, 0, end), where
                lo = rnd.randint(0, end)
                hi = rnd.randint(lo, end)
                got = rows_of(cluster, topic, p, lo, hi, max_bytes)
                assert got == model.visible(p, lo, hi), where
                reads.append((p, lo, hi, got))
            # Re-read identity: every range read before, read again now.
            p, lo, hi, before = rnd.choice(reads)
            assert rows_of(cluster, topic, p, lo, hi, rnd.choice([80, 1 << 20])) == before
        for name in list(model.open):
            end_txn(name, commit=False)
    finally:
        cluster.close()
        for raw in producers.values():
            raw.c.close()
        plain.close()
        topic_admin.close()


def test_a_batch_failing_its_crc_is_refused_not_decoded():
    from semel.client.cluster import ReaderError
    from semel.client.reader import _decode
    good = bytearray(records.build_batch([(b"k", b"value-1"), (b"k", b"value-2")]))
    rows, nxt = _decode(memoryview(bytes(good)), 0, 10, [], True, False)
    assert rows.values == [b"value-1", b"value-2"] and nxt == 2
    good[-3] ^= 0xFF   # one flipped byte inside the records
    with pytest.raises(ReaderError, match="CRC-32C"):
        _decode(memoryview(bytes(good)), 0, 10, [], True, False)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_read_exactly_including_ranges_inside_a_batch(spark_broker, codec):
    from confluent_kafka import Producer
    bs = spark_broker.bootstrap
    topic = f"compressed-{codec}"
    admin = Client(bs)
    assert admin.create_topic(topic, 1) == 0
    admin.close()
    p = Producer({"bootstrap.servers": bs, "compression.type": codec, "linger.ms": 50})
    for i in range(100):
        p.produce(topic, value=b"v%d" % i, partition=0)
    assert p.flush(30) == 0
    with ClusterRouter(bs) as cluster:
        end = cluster.latest([(topic, 0)], True)[(topic, 0)]
        assert end == 100
        assert rows_of(cluster, topic, 0, 0, end, 1 << 20) == [(i, b"v%d" % i) for i in range(100)]
        # Ranges that start and end inside a compressed batch.
        assert rows_of(cluster, topic, 0, 37, 61, 1 << 20) == [(i, b"v%d" % i) for i in range(37, 61)]


def test_a_batch_in_a_codec_that_is_not_installed_fails_in_one_line(monkeypatch):
    import aiokafka.codec
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    from semel.client.cluster import ReaderError

    from semel.client.reader import _decode
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=4, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    builder.append(0, timestamp=1, key=None, value=b"z" * 100, headers=[])
    data = bytes(builder.build())
    assert _decode(memoryview(data), 0, 10, [], True, False)[0].values == [b"z" * 100]
    monkeypatch.setattr(aiokafka.codec, "has_zstd", lambda: False)   # as without cramjam
    with pytest.raises(ReaderError, match="cramjam"):
        _decode(memoryview(data), 0, 10, [], True, False)
