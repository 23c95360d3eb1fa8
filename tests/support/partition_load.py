"""The clients of a partition run, as one process inside the client's network namespace
(python -m tests.support.partition_load BOOTSTRAP TOPIC PARTITIONS OUT STOPFILE).

An idempotent acks=all producer writes one record to every partition each 50 ms, and a
transactional copier (tests.support.copier.Copier) copies TOPIC to TOPIC-copy,
committing its consumed offsets with each transaction. Both follow librdkafka's retry
rules with a request timeout of 5 s (a request to a broker that has gone silent is
given up then and retried where Metadata now points). Every acknowledgement and
every commit is written to OUT as a JSON line with its wall-clock time. Once STOPFILE
exists: the producer flushes, then both topics are read back to their ends (the copy
read_committed) and their values written to OUT, so the test can check that no
acknowledged record is missing and none is there twice.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.support.copier import Copier

CLIENT_RULES = {"retry.backoff.ms": 100, "retry.backoff.max.ms": 500, "topic.metadata.refresh.interval.ms": 5000,
                "metadata.recovery.strategy": "none"}
PRODUCER_RULES = {**CLIENT_RULES, "request.timeout.ms": 5000, "socket.timeout.ms": 5000, "message.timeout.ms": 180000}


class Out:
    def __init__(self, path: str):
        self.f = open(path, "a", buffering=1)
        self.lock = threading.Lock()

    def write(self, **rec) -> None:
        with self.lock:
            self.f.write(json.dumps(rec) + "\n")


class _Bootstrap:
    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap


class StoppableCopier(Copier):
    """The copier of the tests, running until told to stop instead of to given ends."""

    def __init__(self, *args, stop: threading.Event, **kw):
        self.stop = stop
        super().__init__(*args, **kw)

    def _done(self, ends) -> bool:
        return self.stop.is_set()


def produce(bootstrap: str, topic: str, parts: int, out: Out, stop: threading.Event) -> None:
    # librdkafka's idempotence events (epoch bumps, drains) go to the load log: few
    # lines, and what a duplicate in the log is explained by.
    debug = {"debug": os.environ.get("PARTITION_LOAD_DEBUG") or "eos"}
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, **PRODUCER_RULES, **debug})

    def delivered(err, msg):
        if err is None:
            out.write(kind="ack", t=time.time(), p=msg.partition(), v=msg.value().decode(), off=msg.offset())
        else:
            out.write(kind="fail", t=time.time(), p=msg.partition(), v=msg.value().decode(), err=str(err))
    i = 0
    while not stop.is_set():
        for part in range(parts):
            p.produce(topic, value=f"{part}-{i}".encode(), partition=part, on_delivery=delivered)
        i += 1
        p.poll(0.05)
    p.flush(120)
    out.write(kind="produced", t=time.time(), n=i)


def read_back(bootstrap: str, topic: str, parts: int, isolation: str) -> dict[int, list[str]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"readback-{topic}", "enable.auto.commit": False,
                  "isolation.level": isolation, **CLIENT_RULES})
    try:
        tps = [TopicPartition(topic, p, 0) for p in range(parts)]
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), 30)[1] for p in range(parts)}
        c.assign(tps)
        values: dict[int, list[str]] = {p: [] for p in range(parts)}
        pos = {p: 0 for p in range(parts)}
        deadline = time.monotonic() + 120
        while any(pos[p] < ends[p] for p in range(parts)) and time.monotonic() < deadline:
            for m in c.consume(500, 1.0):
                if m.error():
                    continue
                values[m.partition()].append(m.value().decode())
                pos[m.partition()] = m.offset() + 1
            if isolation == "read_committed":   # markers and aborted records end below the watermark
                done = [c.position([TopicPartition(topic, p)])[0].offset for p in range(parts)]
                if all(d >= ends[p] for p, d in enumerate(done)):
                    break
        return values
    finally:
        c.close()


def main(bootstrap: str, topic: str, parts: str, out_path: str, stop_file: str) -> None:
    parts_n = int(parts)
    out = Out(out_path)
    stop = threading.Event()
    copier = StoppableCopier(_Bootstrap(bootstrap), topic, topic + "-copy", f"copier-{topic}", stop=stop)
    copy = threading.Thread(target=copier.run, args=({}, lambda n: out.write(kind="commit", t=time.time(), n=n)),
                            daemon=True)
    prod = threading.Thread(target=produce, args=(bootstrap, topic, parts_n, out, stop), daemon=True)
    prod.start()
    copy.start()
    while not os.path.exists(stop_file):
        time.sleep(0.1)
    stop.set()
    prod.join(150)
    copy.join(150)
    out.write(kind="copier_failures", failures=copier.failures[-20:])
    out.write(kind="log", values=read_back(bootstrap, topic, parts_n, "read_uncommitted"))
    out.write(kind="copy", values=read_back(bootstrap, topic + "-copy", parts_n, "read_committed"))
    out.write(kind="end", t=time.time())


if __name__ == "__main__":
    main(*sys.argv[1:])
