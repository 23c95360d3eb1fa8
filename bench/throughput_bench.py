"""Produce and consume throughput with confluent-kafka, semel (fsync on) vs Tansu (memory).

Same client, same settings, same run: 100 B and 1 KiB records, 1 and 8
partitions, acks=all. semel runs with its default flush policy, so every
acknowledged batch is on disk; Tansu keeps data in memory.

    python -m bench.throughput_bench [--quick]
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.common import RESULTS, main, produce_all, write_result
from semel.launch.process import SemelBroker, TansuBroker

PRODUCER = {"acks": "all", "linger.ms": 5, "batch.size": 1_000_000, "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576, "compression.type": "none"}


def _create(bootstrap, topic, partitions):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def produce(bootstrap, topic, partitions, size, count, conf: dict | None = None) -> float:
    """`conf`: more producer settings (bench.security passes its SASL/TLS ones)."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, **PRODUCER, **(conf or {})})
    value = b"x" * size
    errors = []
    cb = lambda err, msg: errors.append(err) if err else None  # noqa: E731
    t0 = time.perf_counter()
    produce_all(p, topic, partitions, value, count, cb)
    if p.flush(300):
        raise RuntimeError("produce did not finish")
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} delivery errors, first: {errors[0]}")
    return elapsed


def consume(bootstrap, topic, partitions, count) -> float:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                  "fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 10_485_760,
                  "isolation.level": "read_uncommitted"})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = 0
    t0 = time.perf_counter()
    deadline = t0 + 300
    while got < count and time.perf_counter() < deadline:
        # Ask for no more than what is left: consume() waits out its timeout until it has
        # num_messages, which added a second to every measurement.
        for m in c.consume(num_messages=min(10000, count - got), timeout=1.0):
            if not m.error():
                got += 1
    elapsed = time.perf_counter() - t0
    c.close()
    if got < count:
        raise RuntimeError(f"consumed {got}/{count}")
    return elapsed


def measure(broker, label, cases) -> list[dict]:
    rows = []
    for size, partitions, count in cases:
        topic = f"bench-{size}-{partitions}"
        _create(broker.bootstrap, topic, partitions)
        pt = produce(broker.bootstrap, topic, partitions, size, count)
        ct = consume(broker.bootstrap, topic, partitions, count)
        rows.append({"broker": label, "record_bytes": size, "partitions": partitions, "records": count,
                     "produce_rec_s": round(count / pt), "produce_mb_s": round(count * size / pt / 1e6, 2),
                     "consume_rec_s": round(count / ct), "consume_mb_s": round(count * size / ct / 1e6, 2)})
        print(rows[-1], flush=True)
    return rows


def run(out_dir: Path = RESULTS, quick: bool = False) -> dict:
    scale = 0.25 if quick else 1.0
    cases = [(size, parts, int((300_000 if size == 100 else 100_000) * scale))
             for size in (100, 1024) for parts in (1, 8)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="semel-bench-") as tmp:
        with SemelBroker(Path(tmp) / "data", log_path=Path(tmp) / "broker.log") as semel:
            rows += measure(semel, "semel (fsync)", cases)
    with TansuBroker() as tansu:
        rows += measure(tansu, "tansu (memory)", cases)
    ratios = []
    for r in rows:
        if r["broker"].startswith("semel"):
            peer = next(x for x in rows if x["broker"].startswith("tansu")
                        and x["record_bytes"] == r["record_bytes"] and x["partitions"] == r["partitions"])
            ratios.append({"record_bytes": r["record_bytes"], "partitions": r["partitions"],
                           "produce_semel_over_tansu": round(r["produce_rec_s"] / peer["produce_rec_s"], 2),
                           "consume_semel_over_tansu": round(r["consume_rec_s"] / peer["consume_rec_s"], 2)})
    result = {"client": "confluent-kafka (librdkafka)", "settings": PRODUCER, "rows": rows, "ratios": ratios,
              "quick": quick}
    write_result(out_dir, "throughput", result)
    return result


if __name__ == "__main__":
    main(run)
