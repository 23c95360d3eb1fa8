"""Share groups against a classic consumer group: three consumers each, one topic.

One semel broker. Per pass, a fresh topic of 3 partitions filled with 100 B records,
and a fresh group of three consumers, each in its own process: a classic group of
confluent-kafka Consumers, each assigned one partition by hand (so no rebalance pauses
some passes and not others), or a share group of ShareConsumers (implicit
acknowledgement) that subscribe. The consumers start together; a pass's time runs from
the first record any of them got to the last, records/s = records / that time, and
every record must be read (`delivered_twice` counts records read more than once). The
two kinds alternate which goes first. The
share group acknowledges every record (on its next poll), so every fetch but the first
carries acknowledgements the broker writes before it answers, and the broker tracks
the state of every acquired range: more work per record than a classic group, which
commits nothing here. The ratio compares passes of the
same run (the box is shared: absolute rates move with the load).

    python -m bench.share_groups_bench [--quick]
"""
from __future__ import annotations

import multiprocessing
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import SHARED_BOX, load_fields, main, write_result

CONSUMERS, PARTITIONS, SIZE = 3, 3, 100
# Enough that three classic consumers read for a second or more: with 60,000 records
# they emptied their prefetched buffers in 20-80 ms, a span that measured the
# scheduler, not the broker.
RECORDS = 600_000
# librdkafka's defaults pace a classic consumer: once its queue holds
# queued.min.messages it waits fetch.queue.backoff.ms (1 s) before fetching again, so
# three of them read about 340k records/s here whatever the broker does. The
# `classic-prefetch` pass takes that pause out: the fastest classic reading to compare with.
CLASSIC_CONFIGS: dict[str, dict] = {
    "classic": {},
    "classic-prefetch": {"fetch.queue.backoff.ms": 0, "queued.min.messages": 1_000_000},
}
KINDS = ("classic", "classic-prefetch", "share")


def _create(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)


def _fill(bootstrap: str, topic: str, records: int) -> None:
    from confluent_kafka import Producer

    from bench.common import produce_all
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": 10000})
    produce_all(p, topic, PARTITIONS, b"x" * SIZE, records, None)
    assert p.flush(60) == 0


def _reader(kind: str, index: int, bootstrap: str, group: str, topic: str, total: int, counter, go, q) -> None:
    """Child: read until the group as a whole has `total` records (or 10 s of nothing).
    A classic consumer reads partition `index`, assigned by hand: a group rebalance
    (three members joining one after another) would pause it for a second or more in
    some passes and not in others, and the comparison is of reading, not of joining."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, ShareConsumer, TopicPartition
    if kind == "share":
        c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    else:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                      "enable.auto.commit": False, **CLASSIC_CONFIGS[kind]})
    go.wait(60)
    if kind == "share":
        c.subscribe([topic])
    else:
        c.assign([TopicPartition(topic, index, OFFSET_BEGINNING)])
    first = last = None
    seen: list[tuple[int, int]] = []
    idle_since = time.monotonic()
    while counter.value < total and time.monotonic() - idle_since < 10:
        msgs = c.poll(0.5) if kind == "share" else c.consume(num_messages=1000, timeout=0.5)
        got = [(m.partition(), m.offset()) for m in msgs if m.error() is None]
        seen += got
        n = len(got)
        if n:
            now = time.time()
            first, last = first or now, now
            idle_since = time.monotonic()
            with counter.get_lock():
                counter.value += n
    if kind == "share":
        # librdkafka 2.16 sends the implicit acceptances of the last poll only at the
        # next poll or commit, not at close: without this they are released, delivered again
        c.commit_sync()
    c.close()
    q.put((first, last, seen))


def one_pass(kind: str, bootstrap: str, total: int) -> dict:
    group = topic = f"bench-{kind}-{uuid.uuid4().hex[:6]}"
    _create(bootstrap, topic)
    _fill(bootstrap, topic, total)
    if kind == "share":
        from tests.support.share import set_group_configs
        set_group_configs(bootstrap, group, share_auto_offset_reset="earliest")
    ctx = multiprocessing.get_context("spawn")
    counter, go, q = ctx.Value("q", 0), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_reader, args=(kind, i, bootstrap, group, topic, total, counter, go, q), daemon=True)
             for i in range(CONSUMERS)]
    for p in procs:
        p.start()
    time.sleep(3.0)   # interpreters started and confluent_kafka imported before the clock runs
    go.set()
    spans = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(30)
    every = [tp for _, _, seen in spans for tp in seen]
    got = len(set(every))
    starts = [f for f, _, _ in spans if f is not None]
    ends = [last for _, last, _ in spans if last is not None]
    wall = max(ends) - min(starts) if starts else float("inf")
    row = {"kind": kind, "records": got, "delivered_twice": len(every) - got, "wall_s": round(wall, 3),
           "records_per_s": round(got / wall),
           "consumers_that_read": len(starts), "load_average_1m": round(os.getloadavg()[0], 2)}
    print(row, flush=True)
    if got < total:
        raise RuntimeError(f"{kind}: read {got}/{total}")
    return row


def run(out_dir: Path, quick: bool) -> None:
    from semel.launch.process import SemelBroker
    records, rounds = (15_000, 1) if quick else (RECORDS, 3)
    load0 = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as d, SemelBroker(Path(d) / "data", log_path=Path(d) / "broker.log",
                                                        extra_args=["--group-initial-rebalance-delay-ms", "0"]) as b:
        for r in range(rounds):
            order = KINDS if r % 2 == 0 else KINDS[::-1]
            rows += [one_pass(kind, b.bootstrap, records) for kind in order]
    rate = {k: statistics.median(x["records_per_s"] for x in rows if x["kind"] == k) for k in KINDS}
    ratio = round(rate["share"] / rate["classic"], 2)
    ratio_prefetch = round(rate["share"] / rate["classic-prefetch"], 2)
    print(f"share/classic throughput: {ratio} (librdkafka defaults), {ratio_prefetch} (no fetch-queue pause)")
    write_result(out_dir, "share_groups", {
        "setup": f"{CONSUMERS} consumers, {PARTITIONS} partitions, {records} records of {SIZE} B written "
                 f"before the group starts, one broker, {rounds} round(s); confluent-kafka Consumer "
                 f"(librdkafka defaults, and without the fetch-queue pause) vs ShareConsumer (implicit acks)",
        "box": SHARED_BOX, **load_fields(load0), "passes": rows,
        "median_records_per_s": rate, "share_to_classic_ratio": ratio,
        "share_to_classic_prefetch_ratio": ratio_prefetch, "target_ratio": 0.7})


if __name__ == "__main__":
    main(run)
