"""Latency at fixed rates, in the manner of the OpenMessaging Benchmark: semel with
`--flush-mode always` (its default), semel with `--flush-mode interval` and Tansu
(memory storage) side by side in one run, then a 3-broker cluster (RF3, min ISR 2)
and small transactions.

Per point (broker x workload): one idempotent acks=all confluent-kafka producer
(linger.ms 1) sends records at a fixed rate over 8 partitions of a fresh topic. Each
record's key is the time it was *scheduled* to be sent; publish latency is the
delivery callback's time minus that, so a producer that falls behind (a stalled
broker holds its queue) counts the wait as latency (coordinated omission corrected).
A read_committed consumer in another process, positioned at the end of every
partition, reads the same records: end-to-end latency is the time it sees a record
minus its scheduled time. The first `--warmup` seconds of every point are not
counted. The workloads run in turn, each one on all three brokers before the next.

Transactions: one transactional producer, each transaction one record, then
send_offsets_to_transaction and commit_transaction, started at a fixed rate
(100 and 500 a second); latency is from the scheduled start to the commit's return
(the commit_transaction call alone is reported beside it).

For every semel point the broker's own request-latency histograms (semel_request_seconds
and semel_request_stage_seconds, semel.broker.request_times) are scraped before and after
it: `breakdown` gives per API the p50/p99 bucket bounds and means of the total and of
each stage (request_queue, local, response_queue, remote, send) and the event loop's
lag, which is where a missed target's time went. Each point also records the broker's
CPU seconds (/proc/PID/stat) and the load average (the box may be shared).

    python -m bench.latency_bench [--quick] [--duration S] [--warmup S] [--only NAME ...]

A full run (15 s a point, 3 s warm-up) takes about 10 minutes on 2 cores; --quick
(4 s, 1 s) about 3. Results: bench/results/latency.json (or latency_quick.json).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import struct
import tempfile
import time
from pathlib import Path

from bench.common import RESULTS, load_fields, write_result
from bench.hotpath_bench import cpu_seconds
from bench.latency_stats import APIS, breakdown, scrape, summary_ms, targets
from semel.launch.process import SemelBroker, TansuBroker, free_port

PARTITIONS = 8
# (name, record bytes, records per second)
WORKLOADS = [("1KiB@2000", 1024, 2000), ("1KiB@5000", 1024, 5000), ("1KiB@10000", 1024, 10000),
             ("1KiB@20000", 1024, 20000), ("100B@10000", 100, 10000)]
# The cluster runs these (all of them would double the run's length).
CLUSTER_WORKLOADS = ("1KiB@5000", "1KiB@10000")
TXN_RATES = (100, 500)
PRODUCER = {"acks": "all", "enable.idempotence": True, "linger.ms": 1, "compression.type": "none"}
CONSUMER = {"isolation.level": "read_committed", "enable.auto.commit": False, "group.id": "latency-e2e"}
KEY = struct.Struct(">d")
GRACE_S = 10.0         # after a point's last send: the longest wait for deliveries and the consumer


def _machine_extra() -> dict:
    uname = platform.uname()
    return {"kernel": f"{uname.system} {uname.release}", "node_cores": os.cpu_count()}


def _create(bootstrap: str, topic: str, partitions: int, rf: int = 1, config: dict | None = None) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})   # must outlive the future
    try:
        admin.create_topics([NewTopic(topic, partitions, rf, config=config or {})])[topic].result(60)
    except KafkaException as exc:   # a second point on the same broker reuses the topic
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise


# --- the end-to-end reader (its own process: the producer's callbacks keep this one busy) ---

def _consume_worker(bootstrap: str, topic: str, counted_from: float, ready, stop, q) -> None:
    from confluent_kafka import OFFSET_END, Consumer, TopicPartition
    c = Consumer(dict(CONSUMER, **{"bootstrap.servers": bootstrap}))
    c.assign([TopicPartition(topic, p, OFFSET_END) for p in range(PARTITIONS)])
    latencies: list[float] = []
    seen = 0
    deadline = None
    quiet_since = time.monotonic()
    ready.set()
    try:
        while True:
            # consume(n, timeout) waits for n records or the timeout, which would add up to
            # the timeout to every record of a slow rate: wait for the first, then drain.
            first = c.poll(0.05)
            msgs = [first] + c.consume(1000, 0) if first is not None else []
            now = time.time()
            for m in msgs:
                if m.error() is None:
                    seen += 1
                    sent = KEY.unpack(m.key())[0]
                    if sent >= counted_from:
                        latencies.append(now - sent)
            mono = time.monotonic()
            if msgs:
                quiet_since = mono
            if stop.is_set():
                deadline = deadline or mono + GRACE_S
                if mono - quiet_since > 1.0 or mono > deadline:
                    break
    finally:
        c.close()
    q.put({"seen": seen, **summary_ms(latencies)})


class _Reader:
    """The e2e consumer process of one point; every wait on it is bounded."""

    def __init__(self, bootstrap: str, topic: str, counted_from: float) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.ready, self.stop, self.q = ctx.Event(), ctx.Event(), ctx.Queue()
        self.proc = ctx.Process(target=_consume_worker, args=(bootstrap, topic, counted_from, self.ready,
                                                              self.stop, self.q), daemon=True)
        self.proc.start()
        if not self.ready.wait(60):
            self.close()
            raise RuntimeError("the end-to-end consumer did not start")

    def result(self) -> dict:
        self.stop.set()
        try:
            return self.q.get(timeout=GRACE_S + 30)
        except Exception as exc:   # queue.Empty: report it, do not hang the run
            return {"error": f"no result from the consumer: {exc!r}"}
        finally:
            self.close()

    def close(self) -> None:
        self.stop.set()
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)


# --- one point --------------------------------------------------------------------------------

def _publish(bootstrap: str, topic: str, size: int, rate: int, warmup: float, duration: float) -> dict:
    """Send at `rate` for warmup + duration seconds; publish latencies of the counted ones."""
    from confluent_kafka import Producer
    p = Producer(dict(PRODUCER, **{"bootstrap.servers": bootstrap}))
    value = os.urandom(size)
    latencies: list[float] = []
    errors: list[str] = []
    t0 = time.time() + 0.1
    counted_from = t0 + warmup
    total = int(rate * (warmup + duration))

    def delivered(err, msg) -> None:
        if err is not None:
            errors.append(str(err))
            return
        sent = KEY.unpack(msg.key())[0]
        if sent >= counted_from:
            latencies.append(time.time() - sent)

    i, late_max = 0, 0.0
    give_up = t0 + warmup + duration + GRACE_S   # a broker that stopped answering ends the point
    while i < total:
        now = time.time()
        if now > give_up:
            break
        due = min(total, int((now - t0) * rate) + 1)
        while i < due:
            scheduled = t0 + i / rate
            late_max = max(late_max, now - scheduled)
            try:
                p.produce(topic, value, KEY.pack(scheduled), partition=i % PARTITIONS, on_delivery=delivered)
            except BufferError:      # the local queue is full: its wait is latency, counted
                p.poll(0.001)
                continue
            i += 1
        p.poll(0)
        wait = t0 + i / rate - time.time()
        if wait > 0:
            p.poll(min(wait, 0.005))
    left = p.flush(GRACE_S)
    return {"sent": i, "not_sent": total - i, "not_delivered": left, "errors": errors[:3], "error_count": len(errors),
            "max_send_lateness_ms": round(late_max * 1000, 2), "publish_ms": summary_ms(latencies),
            "counted_from": counted_from}


def point(label: str, broker, metrics_ports: list[int], workload: tuple, warmup: float, duration: float,
          rf: int = 1) -> dict:
    name, size, rate = workload
    topic = f"lat-{name.replace('@', '-')}"
    _create(broker.bootstrap, topic, PARTITIONS, rf, {"min.insync.replicas": "2"} if rf > 1 else None)
    if rf > 1:
        _wait_in_sync(broker, topic, rf)
    pids = _pids(broker)
    before, cpu0, load0 = scrape(metrics_ports), [cpu_seconds(p) for p in pids], os.getloadavg()
    reader = _Reader(broker.bootstrap, topic, time.time() + 0.1 + warmup)
    try:
        row = _publish(broker.bootstrap, topic, size, rate, warmup, duration)
    finally:
        e2e = reader.result()
    row.pop("counted_from")
    row = {"broker": label, "workload": name, "record_bytes": size, "rate": rate, **row,
           "e2e_ms": e2e, "broker_cpu_s": [round(cpu_seconds(p) - c, 2) for p, c in zip(pids, cpu0)],
           **load_fields(load0)}
    if metrics_ports:
        row["breakdown"] = breakdown(before, scrape(metrics_ports), APIS)
    _say(row)
    return row


# Transactions a second one transactional producer is asked for: each transaction is
# five blocking round trips of the client (AddPartitionsToTxn, Produce, AddOffsetsToTxn,
# TxnOffsetCommit, EndTxn), 5-10 ms on this box, so one producer cannot keep 100 a
# second; faster rates take more producers, in threads (the client lets go of the GIL).
TXN_PER_PRODUCER = 50


class _TxnClient:
    """One transactional producer running its share of the schedule."""

    def __init__(self, bootstrap: str, name: str, meta) -> None:
        from confluent_kafka import Producer
        self.p = Producer(dict(PRODUCER, **{"bootstrap.servers": bootstrap, "transactional.id": name}))
        self.meta, self.error = meta, None
        self.whole: list[float] = []
        self.offsets: list[float] = []
        self.commits: list[float] = []

    def run(self, schedule: list[float], counted_from: float, stop_at: float, n: int) -> None:
        from confluent_kafka import KafkaException, TopicPartition
        p = self.p
        try:
            for i, scheduled in enumerate(schedule):
                time.sleep(max(0.0, scheduled - time.time()))
                if time.time() > stop_at:
                    break
                began = time.time()
                p.begin_transaction()
                p.produce("lat-txn", b"t" * 100, partition=(i + n) % PARTITIONS)
                p.send_offsets_to_transaction([TopicPartition("lat-txn-source", n, i + 1)], self.meta, 10)
                c0 = time.time()
                p.commit_transaction(10)
                done = time.time()
                if scheduled >= counted_from:
                    self.whole.append(done - scheduled)
                    self.offsets.append(c0 - began)
                    self.commits.append(done - c0)
        except KafkaException as exc:
            self.error = str(exc)
        finally:
            p.flush(GRACE_S)


def txn_point(label: str, broker, metrics_ports: list[int], rate: int, warmup: float, duration: float) -> dict:
    """Transactions of one record + offsets + commit, started at `rate` a second."""
    import threading

    from confluent_kafka import Consumer
    clients_n = max(1, rate // TXN_PER_PRODUCER)
    _create(broker.bootstrap, "lat-txn", PARTITIONS)
    _create(broker.bootstrap, "lat-txn-source", clients_n)
    group = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"lat-txn-{rate}"})
    clients = [_TxnClient(broker.bootstrap, f"lat-{rate}-{n}", group.consumer_group_metadata())
               for n in range(clients_n)]
    before, load0 = scrape(metrics_ports), os.getloadavg()
    try:
        for c in clients:
            c.p.init_transactions(30)
        t0 = time.time() + 0.1
        counted_from, stop_at = t0 + warmup, t0 + warmup + duration + GRACE_S
        times = [t0 + i / rate for i in range(int(rate * (warmup + duration)))]
        threads = [threading.Thread(target=c.run, args=(times[n::clients_n], counted_from, stop_at, n), daemon=True)
                   for n, c in enumerate(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(warmup + duration + 2 * GRACE_S + 30)
    finally:
        group.close()
    # transaction_ms: scheduled start to commit returned (a client that falls behind its
    # rate counts the wait); then the client's two blocking calls apart
    row = {"broker": label, "workload": f"txn@{rate}", "transactions_per_s": rate, "producers": clients_n,
           "transaction_ms": summary_ms([x for c in clients for x in c.whole]),
           "begin_to_offsets_sent_ms": summary_ms([x for c in clients for x in c.offsets]),
           "commit_call_ms": summary_ms([x for c in clients for x in c.commits]),
           "errors": [c.error for c in clients if c.error], **load_fields(load0)}
    if metrics_ports:
        row["breakdown"] = breakdown(before, scrape(metrics_ports), APIS)
    _say(row)
    return row


def _pids(broker) -> list[int]:
    return [b.pid for b in getattr(broker, "brokers", [broker])]


def _say(row: dict) -> None:
    pub = row.get("publish_ms") or row.get("transaction_ms") or {}
    e2e = row.get("e2e_ms") or row.get("commit_call_ms") or {}
    print(f"{row['broker']:15} {row['workload']:12} p50 {pub.get('p50')} p99 {pub.get('p99')} "
          f"p99.9 {pub.get('p99_9')} max {pub.get('max')} | e2e/commit p50 {e2e.get('p50')} p99 {e2e.get('p99')}",
          flush=True)


def _guarded(fn, *args, **kw) -> dict:
    """One point; a point that fails is recorded as such and the run goes on."""
    try:
        return fn(*args, **kw)
    except Exception as exc:
        print(f"point failed: {args[0]} {args[3] if len(args) > 3 else ''}: {exc!r}", flush=True)
        return {"broker": args[0], "workload": str(args[3][0] if isinstance(args[3], tuple) else args[3]),
                "error": repr(exc)}


def _wait_in_sync(cluster, topic: str, rf: int, timeout_s: float = 60) -> None:
    from tests.support.cluster import partitions
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = partitions(cluster, topic)
            if len(state) == PARTITIONS and all(s[0] >= 0 and len(s[3]) == rf for s in state.values()):
                return
        except Exception:   # metadata not there yet
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{topic}: leaders and full ISRs not there after {timeout_s}s")


def _single_points(tmp: Path, warmup: float, duration: float, workloads: list) -> list[dict]:
    """Every workload on semel always, semel interval and Tansu, then transactions on semel always."""
    ports = {"semel always": free_port(), "semel interval": free_port()}
    brokers = {label: SemelBroker(tmp / label.replace(" ", "-"), log_path=tmp / f"{label.replace(' ', '-')}.log",
                                  extra_args=["--flush-mode", label.split()[1], "--metrics-port", str(ports[label]),
                                              "--group-initial-rebalance-delay-ms", "0"])
               for label in ports}
    brokers["tansu"] = TansuBroker()
    rows = []
    try:
        for b in brokers.values():
            b.start()
        for n, wl in enumerate(workloads):
            order = list(brokers)[n % 3:] + list(brokers)[:n % 3]   # who goes first rotates
            for label in order:
                port = ports.get(label)
                rows.append(_guarded(point, label, brokers[label], [port] if port else [], wl, warmup, duration))
        for rate in TXN_RATES:
            rows.append(_guarded(txn_point, "semel always", brokers["semel always"], [ports["semel always"]],
                                 rate, warmup, duration))
    finally:
        for b in brokers.values():
            b.close()
    return rows


def _cluster_points(tmp: Path, warmup: float, duration: float, workloads: list) -> list[dict]:
    from semel.launch.local_cluster import LocalCluster
    from tests.support.cluster import wait_brokers
    cluster = LocalCluster(tmp / "cluster", 3, lease_ttl_s=6)
    ports = []
    for b in cluster.brokers:
        ports.append(free_port())
        b.extra_args += ["--metrics-port", str(ports[-1])]
    rows = []
    try:
        cluster.start()
        wait_brokers(cluster, {0, 1, 2})
        for wl in workloads:
            if wl[0] in CLUSTER_WORKLOADS:
                rows.append(_guarded(point, "semel rf3", cluster, ports, wl, warmup, duration, rf=3))
    finally:
        cluster.close()
    return rows


def table(points: list[dict]) -> str:
    lines = ["| broker | workload | publish p50 / p99 / p99.9 / max (ms) | e2e p50 / p99 (ms) |",
             "|---|---|---|---|"]
    for p in points:
        pub = p.get("publish_ms") or p.get("transaction_ms")
        if pub is None:
            lines.append(f"| {p['broker']} | {p['workload']} | error: {p.get('error')} | |")
            continue
        e2e = p.get("e2e_ms") or p.get("commit_call_ms") or {}
        lines.append(f"| {p['broker']} | {p['workload']} | {pub.get('p50')} / {pub.get('p99')} / "
                     f"{pub.get('p99_9')} / {pub.get('max')} | {e2e.get('p50')} / {e2e.get('p99')} |")
    return "\n".join(lines)


def run(out_dir: Path = RESULTS, quick: bool = False, duration: float | None = None, warmup: float | None = None,
        only: list[str] | None = None, cluster: bool = True) -> dict:
    duration = duration or (4.0 if quick else 15.0)
    warmup = warmup or (1.0 if quick else 3.0)
    workloads = [w for w in WORKLOADS if not only or w[0] in only]
    started, load0 = time.monotonic(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="semel-latency-") as tmp:
        points = _single_points(Path(tmp), warmup, duration, workloads)
        if cluster:
            points += _cluster_points(Path(tmp), warmup, duration, workloads)
    result = {"quick": quick, "seconds_per_point": duration, "warmup_s": warmup, "partitions": PARTITIONS,
              "producer": PRODUCER, "consumer": CONSUMER, "machine_extra": _machine_extra(),
              "run_seconds": round(time.monotonic() - started, 1), **load_fields(load0),
              "points": points, "targets": targets(points)}
    path = write_result(out_dir, "latency", result)
    print(table(points))
    for t in result["targets"]:
        print(f"{'met   ' if t['met'] else 'MISSED'} {t['target']}: {t.get('ratio', t.get('measured_ms'))}")
    print(f"results in {path}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short points (4 s, 1 s warm-up)")
    ap.add_argument("--duration", type=float, default=None, help="seconds counted per point")
    ap.add_argument("--warmup", type=float, default=None, help="seconds sent and not counted first")
    ap.add_argument("--only", action="append", default=None, choices=[w[0] for w in WORKLOADS],
                    help="just this workload (repeatable)")
    ap.add_argument("--no-cluster", action="store_true", help="leave out the 3-broker cluster")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    a = ap.parse_args()
    run(a.out, a.quick, a.duration, a.warmup, a.only, not a.no_cluster)


if __name__ == "__main__":
    main()
