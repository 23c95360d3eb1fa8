"""Cost of exactly-once in the broker, measured in one run against semel.

1. Transactional vs idempotent produce throughput (1 KiB records) with commit
   intervals of 10, 100 and 1000 ms (target: <= 3% loss at 100 ms).
2. read_committed vs read_uncommitted consume throughput over the same
   transactional data (target: ratio >= 0.95).
3. Broker memory per idle transactional id, with 100k ids (target: < 500 B).

    python -m bench.txn_bench [--quick]
"""
from __future__ import annotations

import asyncio
import struct
import tempfile
import time
from pathlib import Path

from bench.common import RESULTS, main, rss_kb, write_result
from bench.throughput_bench import _create
from semel.launch.process import SemelBroker
from semel.protocol.messages import encode_request, request_class

RECORD = b"x" * 1024
BASE = {"acks": "all", "linger.ms": 5, "batch.size": 1_000_000, "queue.buffering.max.kbytes": 1_048_576}


def produce_for(bootstrap, topic, seconds, commit_interval_ms=None) -> int:
    from confluent_kafka import Producer
    conf = dict(BASE, **{"bootstrap.servers": bootstrap, "enable.idempotence": True})
    if commit_interval_ms is not None:
        conf["transactional.id"] = f"bench-{topic}-{commit_interval_ms}"
    p = Producer(conf)
    if commit_interval_ms is not None:
        p.init_transactions(30)
    sent = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        if commit_interval_ms is not None:
            p.begin_transaction()
        txn_end = time.perf_counter() + (commit_interval_ms or 1e9) / 1000
        while time.perf_counter() < min(txn_end, end):
            for _ in range(500):
                try:
                    p.produce(topic, value=RECORD, partition=sent % 4)
                    sent += 1
                except BufferError:
                    p.poll(0.001)
            p.poll(0)
        if commit_interval_ms is not None:
            p.commit_transaction(60)
    p.flush(120)
    return sent


def _rate(bootstrap, topic, seconds, interval=None) -> float:
    _create(bootstrap, topic, 4)
    t0 = time.perf_counter()
    n = produce_for(bootstrap, topic, seconds, interval)
    return n / (time.perf_counter() - t0)


def txn_overhead(bootstrap, seconds) -> list[dict]:
    """Each transactional run sits between two idempotent runs of the same length;
    its baseline is their mean, so drift on a shared machine cancels out."""
    rows = []
    idem = [_rate(bootstrap, "idem-0", seconds)]
    for k, interval in enumerate((10, 100, 1000)):
        rate = _rate(bootstrap, f"txn{interval}", seconds, interval)
        idem.append(_rate(bootstrap, f"idem-{k + 1}", seconds))
        base = (idem[-2] + idem[-1]) / 2
        rows.append({"mode": f"transactional, commit every {interval} ms", "commit_interval_ms": interval,
                     "rec_s": round(rate), "idempotent_baseline_rec_s": round(base),
                     "ratio_to_idempotent": round(rate / base, 3), "loss_pct": round(100 * (1 - rate / base), 1)})
        print(rows[-1], flush=True)
    rows.insert(0, {"mode": "idempotent", "rec_s": round(sum(idem) / len(idem)),
                    "runs_rec_s": [round(r) for r in idem]})
    return rows


def isolation_ratio(bootstrap, count) -> dict:
    _create(bootstrap, "iso", 4)
    from confluent_kafka import Producer
    p = Producer(dict(BASE, **{"bootstrap.servers": bootstrap, "transactional.id": "bench-iso"}))
    p.init_transactions(30)
    for start in range(0, count, 5000):
        p.begin_transaction()
        for i in range(start, min(start + 5000, count)):
            p.produce("iso", value=RECORD, partition=i % 4)
            p.poll(0)
        p.commit_transaction(60)
    ru = rc = 0.0
    for _ in range(2):  # alternate to even out cache effects
        ru += consume_iso(bootstrap, count, "read_uncommitted")
        rc += consume_iso(bootstrap, count, "read_committed")
    return {"records": count, "read_uncommitted_rec_s": round(2 * count / ru),
            "read_committed_rec_s": round(2 * count / rc), "ratio_committed_over_uncommitted": round(ru / rc, 3)}


def consume_iso(bootstrap, count, isolation) -> float:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-iso", "enable.auto.commit": False,
                  "isolation.level": isolation, "fetch.max.bytes": 52_428_800})
    c.assign([TopicPartition("iso", p, 0) for p in range(4)])
    got = 0
    t0 = time.perf_counter()
    while got < count and time.perf_counter() - t0 < 300:
        got += sum(1 for m in c.consume(10000, 1.0) if not m.error())
    elapsed = time.perf_counter() - t0
    c.close()
    return elapsed


async def _init_ids(host, port, ids, connections=32):
    """InitProducerId for many transactional ids, pipelined over several connections."""
    cls = request_class(22)

    async def worker(chunk):
        reader, writer = await asyncio.open_connection(host, port)
        for start in range(0, len(chunk), 64):
            part = chunk[start:start + 64]
            for i, txn_id in enumerate(part):
                body = cls(version=1, transactional_id=txn_id, transaction_timeout_ms=60000)
                writer.write(encode_request(22, 1, i, "bench", body))
            await writer.drain()
            for _ in part:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                await reader.readexactly(size)
        writer.close()

    per = (len(ids) + connections - 1) // connections
    await asyncio.gather(*(worker(ids[i:i + per]) for i in range(0, len(ids), per)))


def memory_per_txn_id(broker, count) -> dict:
    from semel.client import Client
    with Client(broker.bootstrap) as c:  # warm up: coordinators loaded, one id in place
        c.request(22, transactional_id="warm", transaction_timeout_ms=60000)
    time.sleep(0.5)
    before = rss_kb(broker.pid)
    t0 = time.perf_counter()
    asyncio.run(_init_ids(broker.host, broker.port, [f"txn-id-{i:07d}" for i in range(count)]))
    elapsed = time.perf_counter() - t0
    time.sleep(0.5)
    after = rss_kb(broker.pid)
    return {"transactional_ids": count, "rss_before_kb": before, "rss_after_kb": after,
            "bytes_per_id": round((after - before) * 1024 / count), "init_rate_per_s": round(count / elapsed)}


def run(out_dir: Path = RESULTS, quick: bool = False) -> dict:
    seconds = 3 if quick else 8
    with tempfile.TemporaryDirectory(prefix="semel-txnbench-") as tmp:
        with SemelBroker(Path(tmp) / "a", log_path=Path(tmp) / "a.log") as broker:
            overhead = txn_overhead(broker.bootstrap, seconds)
            iso = isolation_ratio(broker.bootstrap, 50_000 if quick else 200_000)
            print(iso, flush=True)
        with SemelBroker(Path(tmp) / "b", log_path=Path(tmp) / "b.log") as broker:
            mem = memory_per_txn_id(broker, 20_000 if quick else 100_000)
            print(mem, flush=True)
    result = {"record_bytes": 1024, "produce": overhead, "isolation": iso, "memory": mem, "quick": quick,
              "targets": {"loss_at_100ms_pct_max": 3, "read_committed_ratio_min": 0.95,
                          "bytes_per_idle_txn_id_max": 500}}
    write_result(out_dir, "transactions", result)
    return result


if __name__ == "__main__":
    main(run)
